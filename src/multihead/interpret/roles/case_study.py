"""The tutorial's case study, "The cat sat on the mat.", answered by searching every head.

A link ``query -> key`` holds in a head when the key is the query's strongest link among word tokens ([CLS], [SEP]
and padding excluded: most BERT heads park spare attention on them, Clark et al. 2019). A word split into sub-tokens
is represented by its first sub-token. For each kind of link, every
head where *all* its pairs hold is reported with the mean weight of those pairs, strongest first; when no head
qualifies, the closest head (highest mean weight) is reported as such.
"""

from __future__ import annotations

import re

import torch

from ..maps import AttentionMaps, is_punctuation, is_special

SENTENCE = "The cat sat on the mat."
WORDS = ["the", "cat", "sat", "on", "the", "mat", "."]
# Word positions in WORDS: the grammar of the sentence, written once (a gold parse), not which heads to look at.
LINKS = {
    "determiner -> noun": [(0, 1), (4, 5)],  # the -> cat, the -> mat
    "verb -> preposition": [(2, 3)],  # sat -> on
    "long range: subject -> object of preposition": [(1, 5)],  # cat -> mat
}


def word_positions(maps: AttentionMaps, words: list[str]) -> list[int] | None:
    """Token index of the first sub-token of each word, or None when the tokens do not spell ``words``."""
    starts = maps.word_starts()
    spelled: list[tuple[int, str]] = []  # (first token, the word it spells)
    for i, (tok, start) in enumerate(zip(maps.tokens, starts)):
        if is_special(tok):
            continue
        piece = tok[2:] if tok.startswith("##") else tok
        if start or not spelled or is_punctuation(tok):  # "mat." is two words, as the gold parse has it
            spelled.append((i, piece.lower()))
        else:
            spelled[-1] = (spelled[-1][0], spelled[-1][1] + piece.lower())
    if [w for _, w in spelled] != words:
        return None
    return [i for i, _ in spelled]


def search(maps: AttentionMaps, pairs: list[tuple[int, int]]) -> list[dict]:
    """Every head where each ``(query, key)`` token pair is the query's strongest link to a word token."""
    words = torch.tensor([not is_special(t) for t in maps.tokens])
    found = []
    for l, w in enumerate(maps.layers):
        for h in range(w.shape[0]):
            a = w[h].masked_fill(~words, -1.0)  # (L, L): specials cannot be the strongest link
            if all(int(a[q].argmax()) == k for q, k in pairs):
                found.append(
                    {"layer": l, "head": h, "weight": round(float(sum(w[h, q, k] for q, k in pairs) / len(pairs)), 4)}
                )
    return sorted(found, key=lambda r: -r["weight"])


def closest(maps: AttentionMaps, pairs: list[tuple[int, int]]) -> dict:
    best = max(
        (
            (l, h, float(sum(w[h, q, k] for q, k in pairs) / len(pairs)))
            for l, w in enumerate(maps.layers)
            for h in range(w.shape[0])
        ),
        key=lambda r: r[2],
    )
    return {"layer": best[0], "head": best[1], "weight": round(best[2], 4)}


def run(maps: AttentionMaps) -> dict:
    """Results per link kind: ``{"pairs": [...tokens...], "heads": [...], "closest": {...}}``; or ``{"skipped"}``
    when the text is not the case-study sentence as these tokens spell it."""
    pos = word_positions(maps, WORDS)
    if pos is None:
        return {"skipped": f"the tokens {maps.tokens} do not spell {WORDS}"}
    out = {}
    # A causal model's query sees only earlier words: each link is read from its later word (the noun attends to its
    # determiner), or no head could have it at all.
    causal = all(bool((torch.triu(w, 1) == 0).all()) for w in maps.layers)
    for kind, links in LINKS.items():
        if causal:
            links = [(k, q) for q, k in links]
            label, _, rest = kind.rpartition(": ")
            kind = (label + ": " if label else "") + " -> ".join(reversed(rest.split(" -> ")))
        pairs = [(pos[q], pos[k]) for q, k in links]
        heads = search(maps, pairs)
        out[kind] = {
            "pairs": [f"{WORDS[a]}({pos[a]}) -> {WORDS[b]}({pos[b]})" for a, b in links],
            "heads": heads,
            "closest": None if heads else closest(maps, pairs),
            # every pair is also "the next (previous) token": a positional head matches it without any grammar
            "adjacent": all(abs(k - q) == 1 for q, k in pairs),
            "causal": causal,
        }
    return out


def is_case_sentence(text: str) -> bool:
    return re.sub(r"\s+", " ", text.strip().lower()) == SENTENCE.lower()


def format_results(results: dict) -> str:
    if "skipped" in results:
        return f"case study skipped: {results['skipped']}"
    lines = []
    for kind, r in results.items():
        lines.append(
            f"{kind}: {', '.join(r['pairs'])}"
            + (
                f"  (each key is also the {'previous' if r.get('causal') else 'next'} token: "
                f"{'previous' if r.get('causal') else 'next'}-token heads match too)"
                if r["adjacent"]
                else ""
            )
        )
        if r["heads"]:
            for f in r["heads"][:5]:
                lines.append(f"   layer {f['layer']} head {f['head']}: strongest word link, mean weight {f['weight']}")
            if len(r["heads"]) > 5:
                lines.append(f"   ... and {len(r['heads']) - 5} more heads")
        else:
            c = r["closest"]
            lines.append(
                f"   no head has it as its strongest word link; closest: layer {c['layer']} head "
                f"{c['head']}, mean weight {c['weight']}"
            )
    return "\n".join(lines)


def highlights(results: dict) -> dict[tuple[int, int], str]:
    """``(layer, head) -> caption`` for the best head of each link kind (for the pictures and the page)."""
    out: dict[tuple[int, int], str] = {}
    if "skipped" in results:
        return out
    for kind, r in results.items():
        if r["heads"]:
            best = r["heads"][0]
            key = (best["layer"], best["head"])
            out[key] = (out[key] + "; " if key in out else "") + kind.split(":")[0]
    return out


__all__ = ["LINKS", "SENTENCE", "format_results", "highlights", "is_case_sentence", "run", "search"]
