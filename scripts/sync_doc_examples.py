"""Copy each example script into the documentation page that shows it.

Every code example of ``docs/*.md`` is a script under ``docs/examples/`` that the tests
run (tests/docs/test_examples.py). A page shows it inline, so that it reads the same on
the docs site and as plain Markdown (a repository browser, an editor), in a fence whose
title names the file::

    ```python title="docs/examples/quickstart.py"
    ...the file's text, exactly...
    ```

The docs site shows the title above the block; a Markdown viewer ignores it. The test
fails when a block differs from its file; after editing an example, run::

    python scripts/sync_doc_examples.py          # rewrite the blocks from the files
    python scripts/sync_doc_examples.py --check  # exit 1, naming each stale block
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# The opening line of a block that shows an example file; the block ends at the next "```".
# A block may be indented (in a list item): its body and closing fence share the opener's
# indentation, except blank lines, which stay empty.
OPENER = re.compile(r'^( *)```python title="(docs/examples/[^"]+)"$')


@dataclass(frozen=True)
class Block:
    """One example block of a page: the file it shows and its lines (0-based, end exclusive)."""

    target: str
    indent: str
    lines: tuple[str, ...]  # as the page holds them, indented
    start: int  # the line after the opener
    end: int  # the closing fence's line
    line: int  # the opener's line, 1-based, for messages


def file_text(target: str) -> str:
    """The text a block of ``target`` must hold: the file's, ending in one newline."""
    return (ROOT / target).read_text(encoding="utf-8").rstrip("\n") + "\n"


def blocks(text: str, page: str = "page") -> list[Block]:
    """The example blocks of a page's ``text``.

    Raises:
        ValueError: A block is not closed.
    """
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opener = OPENER.match(lines[i])
        if opener is None:
            i += 1
            continue
        indent, target = opener.groups()
        end = i + 1
        while end < len(lines) and lines[end] != f"{indent}```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 1}: the block of {target} is not closed")
        found.append(Block(target, indent, tuple(lines[i + 1 : end]), i + 1, end, i + 1))
        i = end + 1
    return found


def expected(block: Block) -> tuple[str, ...]:
    """The lines ``block`` must hold: its file's, at its indentation."""
    return tuple(
        f"{block.indent}{line}" if line else "" for line in file_text(block.target).splitlines()
    )


def synced(text: str, page: str = "page") -> str:
    """``text`` with each example block's body replaced by its file's text."""
    lines = text.splitlines()
    for block in reversed(blocks(text, page)):
        lines[block.start : block.end] = expected(block)
    return "\n".join(lines) + "\n"


def stale(page: Path) -> list[str]:
    """A line for each block of ``page`` that differs from its file (or has no file)."""
    problems = []
    name = page.relative_to(ROOT).as_posix()
    for block in blocks(page.read_text(encoding="utf-8"), name):
        if not (ROOT / block.target).is_file():
            problems.append(f"{name}:{block.line}: {block.target} does not exist")
        elif block.lines != expected(block):
            problems.append(f"{name}:{block.line}: the block differs from {block.target}")
    return problems


def main(argv: list[str]) -> int:
    """Rewrite (or with ``--check``, check) every page's blocks; return the exit status."""
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__)  # noqa: T201
        return 2
    problems: list[str] = []
    for page in sorted(DOCS.glob("*.md")):
        if check:
            problems += stale(page)
            continue
        text = page.read_text(encoding="utf-8")
        new = synced(text, page.name)
        if new != text:
            page.write_text(new, encoding="utf-8")
            print(f"updated {page.relative_to(ROOT)}")  # noqa: T201
    for problem in problems:
        print(problem)  # noqa: T201
    if problems:
        print("run `python scripts/sync_doc_examples.py` to copy the files in")  # noqa: T201
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
