"""A text-image grounding task built from an image dataset: four items on a 2x2 canvas and a question about them.

Each canvas holds four images of four *different* classes, one per quadrant (so every question has one answer), and
one question of two kinds, half each:

* ``where is the sneaker ?``      -> a quadrant (``top left`` ... ``bottom right``): find the item by its class;
* ``what is at the top left ?``   -> a class (``sneaker``): read the item at a place.

Answers share one output space: the four quadrants, then the classes. Both kinds need the image: the question alone
leaves 4 equally likely quadrants or 10 equally likely classes, so a model whose cross-attention heads are masked
answers at chance (1/4 and 1/10).

A canvas is a *spec* -- four image indices, the question kind and the quadrant asked about -- drawn from a seeded
generator; pixels are composed only for the batch being used, so a training run draws fresh canvases every step
(seeded by step, so a resumed run sees the same ones) and the held-out canvases are fixed by their seed.

The questions use a closed word vocabulary (:class:`QuestionVocab`): the templates' words plus the class names, each
class name one word (``t-shirt/top``, ``ankle boot``). A subword tokenizer would add nothing to a 20-word language
and would split class names differently from each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUADRANTS = ["top left", "top right", "bottom left", "bottom right"]  # quadrant q: row q // 2, column q % 2
KINDS = ("where", "what")
TEMPLATE_WORDS = ["where", "is", "the", "what", "at", "?"]
PAD = "[PAD]"


@dataclass
class Canvases:
    """Specs of ``N`` canvases: ``items`` ``(N, 4)`` image indices by quadrant, ``kind`` ``(N,)`` (0 where, 1 what),
    ``quadrant`` ``(N,)`` the quadrant the question is about (the answer of *where*, the place of *what*)."""

    items: torch.Tensor
    kind: torch.Tensor
    quadrant: torch.Tensor

    def __len__(self) -> int:
        return len(self.kind)

    def __getitem__(self, idx) -> Canvases:
        return Canvases(self.items[idx], self.kind[idx], self.quadrant[idx])


def draw_canvases(labels: torch.Tensor, n: int, generator: torch.Generator, *, num_classes: int) -> Canvases:
    """``n`` canvas specs over images with ``labels``: four distinct classes per canvas, one random image of each."""
    by_class = [torch.nonzero(labels == c).flatten() for c in range(num_classes)]
    present = [c for c in range(num_classes) if len(by_class[c])]
    if len(present) < 4:
        raise ValueError(
            f"a canvas needs four different classes; these images have {len(present)} ({present}): use more images"
        )
    classes = (
        torch.stack([torch.randperm(len(present), generator=generator)[:4] for _ in range(n)])
        if n
        else torch.empty(0, 4, dtype=torch.long)
    )
    present_t = torch.tensor(present)
    classes = present_t[classes]  # (n, 4)
    sizes = torch.tensor([len(b) for b in by_class])
    pick = (torch.rand(n, 4, generator=generator) * sizes[classes]).long()  # (n, 4) index within each class
    items = torch.empty(n, 4, dtype=torch.long)
    for c in present:
        hit = classes == c
        items[hit] = by_class[c][pick[hit]]
    kind = torch.randint(0, 2, (n,), generator=generator)
    quadrant = torch.randint(0, 4, (n,), generator=generator)
    return Canvases(items, kind, quadrant)


def render(images: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """uint8 images ``(M, C, H, W)`` and specs' ``items`` ``(N, 4)`` -> canvases ``(N, C, 2H, 2W)``."""
    x = images[items]  # (N, 4, C, H, W)
    top = torch.cat([x[:, 0], x[:, 1]], -1)
    bottom = torch.cat([x[:, 2], x[:, 3]], -1)
    return torch.cat([top, bottom], -2)


class QuestionVocab:
    """Word ids of the questions (0 = padding) and the answers' names (quadrants, then classes)."""

    def __init__(self, class_names: list[str]) -> None:
        self.class_names = [n.lower() for n in class_names]
        self.words = [PAD] + TEMPLATE_WORDS + ["top", "bottom", "left", "right"] + self.class_names
        if len(set(self.words)) != len(self.words):
            raise ValueError(f"class names {class_names} clash with the question words {TEMPLATE_WORDS}")
        self.ids = {w: i for i, w in enumerate(self.words)}
        self.answers = list(QUADRANTS) + self.class_names
        self.max_len = 7  # "what is at the top left ?"

    def __len__(self) -> int:
        return len(self.words)

    def question(self, kind: int, quadrant: int, target_class: int) -> list[str]:
        """The question's words: *where* names ``target_class``; *what* names ``quadrant``."""
        if kind == 0:
            return ["where", "is", "the", self.class_names[target_class], "?"]
        return ["what", "is", "at", "the", *QUADRANTS[quadrant].split(), "?"]

    def encode(self, words: list[str]) -> list[int]:
        unknown = [w for w in words if w not in self.ids]
        if unknown:
            raise ValueError(
                f"unknown words {unknown}; questions are 'where is the CLASS ?' or 'what is at the "
                f"top|bottom left|right ?' with CLASS one of: {', '.join(self.class_names)}"
            )
        return [self.ids[w] for w in words]

    def parse(self, text: str) -> tuple[int, list[int]]:
        """A typed question -> (kind, ids). Class names may contain spaces (``ankle boot``): they are matched whole."""
        t = " ".join(text.lower().replace("?", " ?").split())
        if not t.endswith("?"):
            t += " ?"
        for name in sorted(self.class_names, key=len, reverse=True):
            t = t.replace(f" {name} ", f" {name.replace(' ', chr(0))} ")
        words = [w.replace(chr(0), " ") for w in t.split()]
        kind = 0 if words[:1] == ["where"] else 1 if words[:1] == ["what"] else -1
        ok = (kind == 0 and len(words) == 5 and words[1:3] == ["is", "the"] and words[3] in self.class_names) or (
            kind == 1 and len(words) == 7 and words[1:4] == ["is", "at", "the"] and " ".join(words[4:6]) in QUADRANTS
        )
        if not ok:
            raise ValueError(
                f"cannot read the question {text!r}; ask 'where is the CLASS?' or 'what is at the "
                f"top|bottom left|right?' with CLASS one of: {', '.join(self.class_names)}"
            )
        return kind, self.encode(words)

    def batch(self, specs: Canvases, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Question ids ``(N, max_len)`` (0-padded) and answer ids ``(N,)`` for canvas specs over ``labels``."""
        n = len(specs)
        ids = torch.zeros(n, self.max_len, dtype=torch.long)
        answers = torch.empty(n, dtype=torch.long)
        for i in range(n):
            k, q = int(specs.kind[i]), int(specs.quadrant[i])
            cls = int(labels[specs.items[i, q]])
            words = self.question(k, q, cls)
            ids[i, : len(words)] = torch.tensor(self.encode(words))
            answers[i] = q if k == 0 else len(QUADRANTS) + cls
        return ids, answers


__all__ = ["Canvases", "KINDS", "QUADRANTS", "QuestionVocab", "draw_canvases", "render"]
