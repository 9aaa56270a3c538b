"""Write asyncreplica/_explain/ARnnn.md, the text of `asyncreplica explain`, from docs/errors.md.

docs/errors.md is the one source: each error's section starts at its code's anchor
(``<a id="ar103"></a>``). This script copies each section into the package, with the
title that names each example's file dropped and links reduced to their text, so that
``asyncreplica explain AR103`` works after ``pip install`` without the repository.
tests/docs/test_explain.py fails when the package's copy differs from what this script
writes; run it after editing the page::

    python scripts/gen_explain.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "errors.md"
OUT = ROOT / "asyncreplica" / "_explain"
CODE_ANCHOR = re.compile(r'^<a id="(ar\d{3})"></a>\n', re.MULTILINE)
ANY_ANCHOR = re.compile(r'^<a id="[^"]*"></a>\n', re.MULTILINE)
# The page shows each example inline, in a fence titled with its file (see
# scripts/sync_doc_examples.py); the package has no docs/examples/, so the title goes.
TITLED_FENCE = re.compile(r'^(\s*```python) title="[^"]*"$', re.MULTILINE)
LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")
HEADING = re.compile(r"^## (\w+) \((AR\d{3})\)$", re.MULTILINE)


def render() -> dict[str, str]:
    """The text of each code, ``{"AR103": "...", ...}``, from docs/errors.md."""
    text = PAGE.read_text(encoding="utf-8")
    starts = list(CODE_ANCHOR.finditer(text))
    sections: dict[str, str] = {}
    for i, start in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        body = ANY_ANCHOR.sub("", text[start.start() : end]).strip("\n")
        body = HEADING.sub(r"# \2: \1", body, count=1)
        body = TITLED_FENCE.sub(r"\1", body)
        body = LINK.sub(r"\1", body)
        code = start[1].upper()
        if not body.startswith(f"# {code}: "):
            raise ValueError(
                f"docs/errors.md: the anchor {start[1]} is not followed by its heading"
            )
        sections[code] = body + "\n"
    return sections


def main() -> int:
    """Write the files, remove those of codes that are gone; return the exit status."""
    sections = render()
    OUT.mkdir(exist_ok=True)
    for stale in OUT.glob("AR*.md"):
        if stale.stem not in sections:
            stale.unlink()
    for code, body in sections.items():
        (OUT / f"{code}.md").write_text(body, encoding="utf-8")
    print(f"wrote {len(sections)} explanations to {OUT.relative_to(ROOT)}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
