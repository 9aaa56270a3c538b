"""The broken and fixed example programs of tests/lint/cases/, one pair per scenario.

Each ``broken_*.py`` marks the collective the check must flag with ``# @flag NAME`` and the
condition it depends on with ``# @cond NAME``; each ``fixed_*.py`` must give no finding. The
scenarios are those of the research notes (peer_detection.md §5) that a static check can see:
1, 2, 13, 15, 16, 19 and 20.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncreplica._tools._lint import Finding, lint_paths

CASES = Path(__file__).parent / "cases"
BROKEN = sorted(CASES.glob("broken_*.py"))
FIXED = sorted(CASES.glob("fixed_*.py"))
MARKER = re.compile(r"@(flag|cond) (\w+)")
SCENARIOS = {"s01", "s02", "s13", "s15", "s16", "s19", "s20"}


def expected(path: Path) -> set[tuple[int, int]]:
    """``{(collective line, condition line)}`` from the file's markers."""
    flags: dict[str, int] = {}
    conds: dict[str, int] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for kind, name in MARKER.findall(text):
            (flags if kind == "flag" else conds)[name] = number
    assert flags.keys() == conds.keys(), f"{path.name}: unpaired markers"
    return {(flags[name], conds[name]) for name in flags}


def test_every_scenario_has_a_broken_and_a_fixed_program() -> None:
    def scenario(p: Path) -> str:
        return p.stem.split("_")[1]

    assert {scenario(p) for p in BROKEN} == SCENARIOS
    assert [p.name.replace("broken_", "") for p in BROKEN] == [
        p.name.replace("fixed_", "") for p in FIXED
    ]


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_program_is_flagged_at_the_marked_lines(path: Path) -> None:
    want = expected(path)
    assert want, f"{path.name} marks no collective"
    findings = lint_paths([str(path)])
    assert {(f.line, f.condition_line) for f in findings} == want
    for finding in findings:
        assert finding.path == str(path)
        assert f"at line {finding.line} " in finding.message
        assert f"(line {finding.condition_line})" in finding.message


@pytest.mark.parametrize("path", FIXED, ids=[p.stem for p in FIXED])
def test_fixed_program_is_clean(path: Path) -> None:
    assert not MARKER.search(path.read_text(encoding="utf-8"))
    assert lint_paths([str(path)]) == []


def test_the_cases_directory_as_a_whole() -> None:
    findings = lint_paths([str(CASES)])
    assert all(isinstance(f, Finding) for f in findings)
    assert {Path(f.path).name for f in findings} == {p.name for p in BROKEN}
    assert findings == sorted(findings, key=lambda f: (f.path, f.line, f.col))
    assert len(findings) == sum(len(expected(p)) for p in BROKEN)
