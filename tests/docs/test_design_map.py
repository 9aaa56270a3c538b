"""docs/design.md's module map names every module of the package and the backends.

Adding a module without its line in the map (or leaving the line of a removed one)
fails here, so the map a newcomer reads is the code's.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")


def _map_rows() -> dict[str, str]:
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index("\n## Module map\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match and match.group(1) != "module":
            assert match.group(1) not in rows, f"{match.group(1)} is listed twice"
            rows[match.group(1)] = match.group(2)
    return rows


def _modules() -> set[str]:
    found = set()
    for top in ("asyncreplica", "backends"):
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" in path.parts or path.suffix not in (".py", ".c"):
                continue
            found.add(path.relative_to(ROOT).as_posix())
    return found


def test_every_module_has_one_line_in_the_map() -> None:
    rows = _map_rows()
    modules = _modules()
    missing = sorted(modules - set(rows))
    stale = sorted(set(rows) - modules)
    assert not missing, f"docs/design.md's module map lacks: {missing}"
    assert not stale, f"docs/design.md's module map names modules that do not exist: {stale}"


def test_each_line_says_what_the_module_owns() -> None:
    for module, owns in _map_rows().items():
        assert len(owns.split()) >= 4, f"{module}: say what it owns in a sentence, not {owns!r}"
