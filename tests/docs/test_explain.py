"""Error codes and ``asyncreplica explain``: one code per error kind, explained offline.

docs/errors.md is the one source of the explanations: scripts/gen_explain.py copies each
code's section into the package (asyncreplica/_explain/ARnnn.md), and the first test here
fails when the copy is stale. Every message ends with the command that explains it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import asyncreplica as ar
from asyncreplica._core._codes import CODES, see_also
from asyncreplica._tools._cli import main

ROOT = Path(__file__).resolve().parents[2]
ERRORS_PAGE = ROOT / "docs" / "errors.md"
EXPLAINED = ROOT / "asyncreplica" / "_explain"
EXCEPTIONS = [
    name
    for name in ar.__all__
    if isinstance(getattr(ar, name), type) and issubclass(getattr(ar, name), BaseException)
]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_explain", ROOT / "scripts/gen_explain.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_exception_has_its_own_code() -> None:
    assert sorted(CODES) == sorted(EXCEPTIONS)
    assert len(set(CODES.values())) == len(CODES)
    for name in EXCEPTIONS:
        assert getattr(ar, name).code == CODES[name]
        assert re.fullmatch(r"AR\d{3}", CODES[name])


def test_the_packaged_explanations_are_the_docs_sections() -> None:
    generated = _generator().render()
    assert sorted(generated) == sorted(CODES.values())
    shipped = {p.stem: p.read_text(encoding="utf-8") for p in EXPLAINED.glob("AR*.md")}
    stale = sorted(code for code in generated if shipped.get(code) != generated[code])
    assert not stale, f"run `python scripts/gen_explain.py`: stale explanations {stale}"
    assert sorted(shipped) == sorted(generated)


@pytest.mark.parametrize(("name", "code"), sorted(CODES.items(), key=lambda item: item[1]))
def test_explain_prints_the_section(
    capsys: pytest.CaptureFixture[str], name: str, code: str
) -> None:
    assert main(["explain", code.lower()]) == 0
    out = capsys.readouterr().out

    assert out.startswith(f"# {code}: {name}\n")
    # What it means, a real message, and the broken/fixed pair, with the scripts inlined.
    assert "Broken" in out
    assert "Fixed" in out
    assert out.count("```python") >= 2
    assert "--8<--" not in out
    assert "import asyncreplica as ar" in out
    assert "](" not in out  # links reduced to their text
    # The docs site has one anchor per code.
    assert f'<a id="{code.lower()}"></a>' in ERRORS_PAGE.read_text(encoding="utf-8")


def test_explain_takes_a_class_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ReplicaExitedError"]) == 0
    assert capsys.readouterr().out.startswith("# AR103: ReplicaExitedError\n")


def test_explain_without_a_code_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    for name, code in CODES.items():
        assert f"  {code}  {name}" in out


def test_explain_of_an_unknown_code_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "AR999"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("asyncreplica explain: error: unknown error code 'AR999'")


def test_explain_through_the_installed_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "asyncreplica", "explain", "AR102"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# AR102: CollectiveMismatchError")


# Every raised error kind carries its code ------------------------------------------------


# The kinds a message can be given to directly; the others are built from run data, and
# the broken examples below raise each of them.
SIMPLE = [
    "AsyncReplicaError",
    "BackendError",
    "BackendNotFoundError",
    "CollectiveError",
    "ReplicaContextError",
]


@pytest.mark.parametrize("name", SIMPLE)
def test_the_message_ends_with_the_explain_command(name: str) -> None:
    cls = getattr(ar, name)
    if name == "BackendNotFoundError":
        error = cls("nunpy", ["numpy"])
    else:
        error = cls("something went wrong")
        # A message that already ends with the command does not get it twice.
        assert str(cls(str(error))) == str(error)
    assert str(error).endswith(f"\nFor more on this error, run `asyncreplica explain {cls.code}`.")


# docs/examples/errors/<anchor>_broken.py raises the error of <anchor> (and prints it);
# asyncreplicaerror_broken.py shows the base class catching a ReplicaExitedError.
BROKEN = sorted((ROOT / "docs" / "examples" / "errors").glob("*_broken.py"))


@pytest.mark.parametrize("script", BROKEN, ids=[p.name for p in BROKEN])
def test_each_raised_error_ends_with_its_code(script: Path) -> None:
    anchor = script.name.split("_")[0]
    kind = "ReplicaExitedError" if anchor == "asyncreplicaerror" else anchor
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The scripts print the error (some print more after it); its last line is the command.
    assert see_also(kind) + "\n" in proc.stdout, proc.stdout
    assert proc.stdout.count("asyncreplica explain") == 1
