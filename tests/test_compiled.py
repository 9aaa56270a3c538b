"""The compiled hot path: what the build made, what runs, and the switch back to the sources.

The suite runs twice in CI: compiled (the default) and with ``ASYNCREPLICA_NO_EXTENSIONS=1``.
``test_the_implementation_that_should_run_does`` makes sure the first run really runs the
extension modules whenever the build could compile them, so CI cannot run pure Python twice
without noticing.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

import asyncreplica
from asyncreplica import _compiled
from asyncreplica._doctor import diagnose, render_text

ROOT = pathlib.Path(__file__).resolve().parent.parent
NO_EXTENSIONS = os.environ.get(_compiled.ENV_VAR, "").strip() not in ("", "0")


def _build_info() -> dict[str, object]:
    path = pathlib.Path(asyncreplica.__file__).parent / "_build_info.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def test_the_implementation_that_should_run_does() -> None:
    info = _build_info()
    current = _compiled.current()
    if NO_EXTENSIONS:
        assert _compiled.compiled_modules() == ()
        assert current.describe() == f"interpreted: {_compiled.ENV_VAR}=1 at run time"
        for name in current.modules:
            assert sys.modules[name].__file__.endswith(".py"), name  # type: ignore[union-attr]
        return
    status = info.get("status")
    if status in ("disabled", "unavailable"):
        pytest.skip(f"the build compiled nothing ({status}: {info.get('reason')})")
    assert status == "compiled", f"the build failed to compile: {info}"
    assert current.compiled, current.reason
    assert _compiled.compiled_modules() == tuple(info["modules"])  # type: ignore[arg-type]
    assert current.describe() == f"compiled (mypyc): {len(current.modules)} modules"
    assert "asyncreplica._core._ledger" in current.modules
    # The collective's native classes (Collective, Slot, Rendezvous): the arrival's hot path.
    assert "asyncreplica._runtime._collective" in current.modules


def test_the_modules_that_are_compiled_are_the_ones_the_build_was_asked_for() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    info = _build_info()
    if not info:
        pytest.skip("not installed by pip: no build record")
    for name in info["modules"]:  # type: ignore[attr-defined]
        assert f'"{name}",' in pyproject
        assert ROOT.joinpath(*name.split(".")).with_suffix(".py").is_file()


def test_doctor_says_which_implementation_runs() -> None:
    diagnosis = diagnose()
    lines = render_text(diagnosis).splitlines()
    assert lines[3] == f"hot path: {_compiled.current().describe()}"
    assert diagnosis.as_dict()["hot_path"] == _compiled.current().describe()
    assert diagnosis.compiled_modules == _compiled.compiled_modules()


_PROBE = """
import json, sys
import asyncreplica
from asyncreplica import _compiled
from asyncreplica._doctor import diagnose
print(json.dumps({
    "files": [sys.modules[m].__file__ for m in _compiled.current().modules],
    "compiled": list(_compiled.compiled_modules()),
    "hot_path": diagnose().hot_path,
}))
"""


def test_the_environment_variable_runs_the_sources_even_when_compiled() -> None:
    env = {**os.environ, _compiled.ENV_VAR: "1"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env
    )
    data = json.loads(out.stdout)
    assert data["compiled"] == []
    assert all(file.endswith(".py") for file in data["files"]), data["files"]
    if _build_info().get("status") == "compiled":
        assert data["hot_path"] == f"interpreted: {_compiled.ENV_VAR}=1 at run time"
        assert len(data["files"]) == len(_compiled.current().modules) > 0


def _decide_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, info: object
) -> _compiled.Implementation:
    record = tmp_path / "_build_info.json"
    record.write_text(json.dumps(info))
    monkeypatch.setattr(_compiled, "_BUILD_INFO", record)
    monkeypatch.delenv(_compiled.ENV_VAR, raising=False)
    return _compiled._decide()


def test_an_edited_source_runs_interpreted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    ledger = ROOT / "asyncreplica/_core/_ledger.py"
    match = ROOT / "asyncreplica/_core/_match.py"
    sources = {
        "asyncreplica._core._match": _compiled._digest(match),
        "asyncreplica._core._ledger": "00000000-1",  # not what the file holds now
    }
    info = {"status": "compiled", "reason": "", "modules": list(sources), "sources": sources}
    decision = _decide_with(monkeypatch, tmp_path, info)
    assert not decision.compiled
    assert decision.describe() == (
        "interpreted: _core/_ledger.py changed since it was compiled; "
        "reinstall (pip install -e .) to compile it again"
    )
    assert ledger.is_file()
    sources["asyncreplica._core._ledger"] = _compiled._digest(ledger)
    assert _decide_with(monkeypatch, tmp_path, info).compiled


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        pytest.param(
            {"status": "unavailable", "reason": "no C compiler ('/nonexistent' not found)"},
            "interpreted: not compiled at install "
            "(unavailable: no C compiler ('/nonexistent' not found))",
            id="no-compiler",
        ),
        pytest.param(
            {"status": "disabled", "reason": "ASYNCREPLICA_NO_EXTENSIONS=1 at build time"},
            "interpreted: not compiled at install "
            "(disabled: ASYNCREPLICA_NO_EXTENSIONS=1 at build time)",
            id="disabled",
        ),
        pytest.param(
            [], "interpreted: no build record (_build_info.json): not installed with pip", id="none"
        ),
    ],
)
def test_doctor_line_says_why_nothing_was_compiled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, info: object, expected: str
) -> None:
    assert _decide_with(monkeypatch, tmp_path, info).describe() == expected


def test_the_source_finder_loads_only_the_named_modules_from_source(tmp_path: pathlib.Path) -> None:
    (tmp_path / "hot.py").write_text("X = 1\n")
    finder = _compiled._SourceFinder(["pkg.hot"])
    spec = finder.find_spec("pkg.hot", [str(tmp_path)])
    assert spec is not None
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)
    assert spec.origin == str(tmp_path / "hot.py")
    assert finder.find_spec("pkg.cold", [str(tmp_path)]) is None
    assert finder.find_spec("pkg.hot", None) is None


def _build_wheel(tmp_path: pathlib.Path, **env: str) -> tuple[zipfile.ZipFile, str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = tmp_path.glob("asyncreplica-*.whl")
    return zipfile.ZipFile(wheel), out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)  # pip makes a build environment (hatchling only: nothing to compile)
@pytest.mark.skipif(NO_EXTENSIONS, reason="builds a wheel: once per CI run is enough")
@pytest.mark.parametrize(
    ("env", "status", "notice"),
    [
        pytest.param(
            {"CC": "/nonexistent"},
            "unavailable",
            "asyncreplica: installing pure Python, not compiled "
            "(unavailable: no C compiler ('/nonexistent' not found)); it runs the same, slower",
            id="no-compiler",
        ),
        pytest.param(
            {_compiled.ENV_VAR: "1"},
            "disabled",
            "asyncreplica: installing pure Python, not compiled "
            "(disabled: ASYNCREPLICA_NO_EXTENSIONS=1 at build time); it runs the same, slower",
            id="disabled",
        ),
    ],
)
def test_a_build_without_compilation_installs_pure_python(
    tmp_path: pathlib.Path, env: dict[str, str], status: str, notice: str
) -> None:
    wheel, log = _build_wheel(tmp_path, **env)
    assert notice in log
    names = wheel.namelist()
    assert wheel.filename.endswith("-py3-none-any.whl")
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert "asyncreplica/_core/_ledger.py" in names
    info = json.loads(wheel.read("asyncreplica/_build_info.json"))
    assert (info["status"], info["sources"]) == (status, {})
