"""Rebuild ``src/multihead/interpret/pages/assets/zh-headings.woff``: the Chinese characters of the explain page's
headings, cut from Noto Sans CJK SC (SIL Open Font License 1.1, see ``assets/OFL.txt``), so the headings render on
machines without a CJK font. Run after changing the headings:

    apt-get install fonts-noto-cjk
    .venv/bin/python tools/subset_zh_font.py

fontTools (a matplotlib dependency) does the cutting; WOFF with zlib needs no brotli.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
FAMILY = "Noto Sans CJK SC"


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from multihead.interpret.pages.explain import zh_characters

    if not SOURCE.exists():
        print(f"{SOURCE} is missing: apt-get install fonts-noto-cjk", file=sys.stderr)
        return 1
    fonts = TTCollection(str(SOURCE)).fonts
    font = next(f for f in fonts if f["name"].getDebugName(1) == FAMILY)
    text = "".join(sorted(zh_characters()))
    options = subset.Options()
    options.flavor = "woff"
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.notdef_outline = True
    sub = subset.Subsetter(options)
    sub.populate(text=text)
    sub.subset(font)
    font.flavor = "woff"
    out = ROOT / "src/multihead/interpret/pages/assets/zh-headings.woff"
    font.save(str(out))
    print(f"wrote {out}: {len(text)} characters, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
