"""The documentation's examples run, and every page includes only examples that exist.

Every code example in ``docs/*.md`` lives in ``docs/examples/`` as a script that asserts
what the page claims; pages include them with the pymdownx.snippets line
``--8<-- "docs/examples/NAME.py"``. This module runs each script in a fresh interpreter
and checks the includes in both directions.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
PAGES = sorted(DOCS.glob("*.md"))
INCLUDE = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$', re.MULTILINE)
TIMEOUT_S = 60


def _includes(page: Path) -> list[str]:
    return INCLUDE.findall(page.read_text(encoding="utf-8"))


def test_there_are_examples_and_pages() -> None:
    assert EXAMPLES, "no docs/examples/*.py found"
    assert PAGES, "no docs/*.md found"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(example: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(example)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{example.relative_to(ROOT)} exited with {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_includes_use_the_checked_syntax(page: Path) -> None:
    # Any other spelling (single quotes, sections, inline) would escape the checks below.
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if "--8<--" in line:
            assert INCLUDE.match(line), (
                f'{page.name}:{number}: write includes as --8<-- "docs/examples/NAME.py" '
                f"alone on a line, got {line!r}"
            )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_includes_point_at_existing_examples(page: Path) -> None:
    for target in _includes(page):
        assert (ROOT / target).is_file(), f"{page.name} includes {target!r}, which does not exist"
        assert target.startswith("docs/examples/"), (
            f"{page.name} includes {target!r}: examples live in docs/examples/"
        )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_includes_are_inside_python_fences(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
        elif INCLUDE.match(line):
            assert fence == "python", (
                f"{page.name}:{number}: the include must sit in a ```python fenced block"
            )


def test_every_example_is_included_by_a_page() -> None:
    included = {target for page in PAGES for target in _includes(page)}
    orphans = [
        str(p.relative_to(ROOT))
        for p in EXAMPLES
        if str(p.relative_to(ROOT).as_posix()) not in included
    ]
    assert not orphans, f"examples no page includes: {orphans}"
