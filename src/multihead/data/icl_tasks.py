"""Few-shot tasks for in-context learning, written here (no download): each a list of ``(input, output)`` word pairs
whose answer a model can only give by inferring the task from the demonstrations, as in Todd et al. 2024 ("Function
Vectors in Large Language Models") and Yin & Steinhardt 2025.

Every pair is a common English word or name; the output's first token decides whether an answer is right."""

from __future__ import annotations

ANTONYM = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("open", "closed"), ("good", "bad"),
    ("happy", "sad"), ("light", "dark"), ("rich", "poor"), ("strong", "weak"), ("early", "late"), ("high", "low"),
    ("young", "old"), ("long", "short"), ("full", "empty"), ("hard", "soft"), ("wet", "dry"), ("loud", "quiet"),
    ("thick", "thin"), ("clean", "dirty"), ("win", "lose"), ("buy", "sell"), ("push", "pull"), ("begin", "end"),
    ("true", "false"), ("inside", "outside"), ("above", "below"), ("before", "after"), ("always", "never"),
    ("friend", "enemy"), ("heavy", "light"), ("cheap", "expensive"), ("safe", "dangerous"), ("near", "far"),
    ("wide", "narrow"), ("first", "last"), ("day", "night"), ("love", "hate"), ("sweet", "sour"), ("deep", "shallow"),
    ("alive", "dead"), ("accept", "reject"), ("arrive", "leave"), ("remember", "forget"), ("increase", "decrease"),
    ("north", "south"), ("east", "west"), ("left", "right"), ("brave", "afraid"), ("polite", "rude"),
    ("question", "answer"), ("top", "bottom"), ("front", "back"), ("sharp", "dull"), ("tight", "loose"),
    ("major", "minor"), ("maximum", "minimum"), ("success", "failure"), ("visible", "invisible"), ("asleep", "awake"),
]  # fmt: skip

COUNTRY_CAPITAL = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
    ("China", "Beijing"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"), ("Canada", "Ottawa"),
    ("Australia", "Canberra"), ("Brazil", "Brasilia"), ("Argentina", "Buenos"),
    ("India", "New"), ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"), ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Portugal", "Lisbon"),
    ("Ireland", "Dublin"), ("Belgium", "Brussels"), ("Netherlands", "Amsterdam"), ("Hungary", "Budapest"),
    ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"),
    ("Indonesia", "Jakarta"), ("Philippines", "Manila"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Colombia", "Bogota"), ("Cuba", "Havana"), ("Ukraine", "Kyiv"), ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"), ("Czechia", "Prague"), ("Switzerland", "Bern"),
    ("Scotland", "Edinburgh"), ("Wales", "Cardiff"), ("England", "London"), ("Nigeria", "Abuja"),
    ("Ethiopia", "Addis"), ("Morocco", "Rabat"), ("Pakistan", "Islamabad"), ("Afghanistan", "Kabul"),
    ("Lebanon", "Beirut"), ("Syria", "Damascus"), ("Israel", "Jerusalem"), ("Iceland", "Reykjavik"),
]  # fmt: skip

PRESENT_PAST = [
    ("go", "went"), ("see", "saw"), ("eat", "ate"), ("run", "ran"), ("take", "took"), ("give", "gave"),
    ("write", "wrote"), ("speak", "spoke"), ("drink", "drank"), ("sing", "sang"), ("swim", "swam"), ("fly", "flew"),
    ("know", "knew"), ("grow", "grew"), ("throw", "threw"), ("draw", "drew"), ("come", "came"), ("become", "became"),
    ("begin", "began"), ("break", "broke"), ("choose", "chose"), ("drive", "drove"), ("ride", "rode"),
    ("rise", "rose"), ("forget", "forgot"), ("get", "got"), ("find", "found"), ("think", "thought"),
    ("buy", "bought"), ("bring", "brought"), ("teach", "taught"), ("catch", "caught"), ("fight", "fought"),
    ("sell", "sold"), ("tell", "told"), ("hold", "held"), ("stand", "stood"), ("understand", "understood"),
    ("sit", "sat"), ("meet", "met"), ("feed", "fed"), ("lead", "led"), ("keep", "kept"), ("sleep", "slept"),
    ("feel", "felt"), ("leave", "left"), ("lose", "lost"), ("send", "sent"), ("spend", "spent"), ("build", "built"),
    ("walk", "walked"), ("play", "played"), ("jump", "jumped"), ("open", "opened"), ("call", "called"),
    ("ask", "asked"), ("help", "helped"), ("work", "worked"), ("talk", "talked"), ("look", "looked"),
]  # fmt: skip

SINGULAR_PLURAL = [
    ("cat", "cats"), ("dog", "dogs"), ("book", "books"), ("car", "cars"), ("tree", "trees"), ("house", "houses"),
    ("bird", "birds"), ("apple", "apples"), ("chair", "chairs"), ("table", "tables"), ("door", "doors"),
    ("window", "windows"), ("friend", "friends"), ("river", "rivers"), ("flower", "flowers"), ("street", "streets"),
    ("child", "children"), ("man", "men"), ("woman", "women"), ("mouse", "mice"), ("foot", "feet"),
    ("tooth", "teeth"), ("goose", "geese"), ("person", "people"), ("box", "boxes"), ("bus", "buses"),
    ("glass", "glasses"), ("church", "churches"), ("city", "cities"), ("baby", "babies"), ("party", "parties"),
    ("story", "stories"), ("knife", "knives"), ("leaf", "leaves"), ("wolf", "wolves"), ("life", "lives"),
    ("horse", "horses"), ("ship", "ships"), ("king", "kings"), ("queen", "queens"), ("song", "songs"),
    ("teacher", "teachers"), ("student", "students"), ("doctor", "doctors"), ("farmer", "farmers"),
    ("mountain", "mountains"), ("island", "islands"), ("garden", "gardens"), ("letter", "letters"),
    ("picture", "pictures"), ("bottle", "bottles"), ("pencil", "pencils"), ("shoe", "shoes"), ("hat", "hats"),
    ("egg", "eggs"), ("cup", "cups"), ("key", "keys"), ("boy", "boys"), ("girl", "girls"), ("star", "stars"),
]  # fmt: skip

CAPITALIZE = [
    (w, w.capitalize())
    for w in (
        "apple", "river", "garden", "window", "yellow", "silver", "morning", "winter", "summer", "paper", "market",
        "doctor", "mountain", "forest", "island", "letter", "music", "orange", "planet", "rabbit", "school",
        "teacher", "village", "wonder", "bridge", "castle", "dragon", "engine", "family", "guitar", "harbor",
        "jacket", "kitchen", "lemon", "mirror", "number", "ocean", "pocket", "question", "rocket", "sister",
        "tiger", "umbrella", "violin", "water", "zebra", "butter", "candle", "dinner", "finger", "hammer",
        "ladder", "monkey", "pepper", "soldier", "travel", "valley", "wallet", "button", "cotton",
    )
]  # fmt: skip

TASKS: dict[str, list[tuple[str, str]]] = {
    "antonym": ANTONYM,
    "country-capital": COUNTRY_CAPITAL,
    "present-past": PRESENT_PAST,
    "singular-plural": SINGULAR_PLURAL,
    "capitalize": CAPITALIZE,
}

__all__ = ["TASKS"]
