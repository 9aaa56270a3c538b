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
from asyncreplica._tools._doctor import diagnose, render_text

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
from asyncreplica._tools._doctor import diagnose
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
    info = {
        "status": "compiled",
        "reason": "",
        "modules": list(sources),
        "sources": sources,
        "editable": True,
    }
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


# The numpy backend's C pass over a batch (asyncreplica_numpy/_cpass.c), built beside mypyc.
CPASS = "asyncreplica_numpy._cpass"


class _Counting:
    """Stands in for the C pass and counts the calls of each of its functions."""

    def __init__(self, module: object) -> None:
        self.module = module
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> object:
        function = getattr(self.module, name)

        def call(*args: object) -> object:
            self.calls[name] = self.calls.get(name, 0) + 1
            return function(*args)

        return call


def test_the_batch_pass_that_should_run_does() -> None:
    import anyio
    import numpy as np
    from asyncreplica_numpy import NumpyBackend, _backend

    import asyncreplica as ar

    record = _build_info().get("c_extensions", {}).get(CPASS, {})  # type: ignore[attr-defined]
    if NO_EXTENSIONS:
        assert _backend._CPASS is None
        assert _backend.batch_pass() == f"interpreted: {_compiled.ENV_VAR}=1 at run time"
        assert NumpyBackend(["CPU:0"])._cpass is None
        return
    if record.get("status") in ("disabled", "unavailable"):
        pytest.skip(f"the build compiled no C pass ({record})")
    assert record.get("status") == "compiled", f"the build failed to compile the C pass: {record}"
    assert _backend._CPASS is not None, _backend.batch_pass()
    assert _backend.batch_pass() == f"compiled (C): {CPASS}"
    assert isinstance(_backend._CPASS.__spec__.loader, importlib.machinery.ExtensionFileLoader)  # type: ignore[attr-defined]
    # A batched all_reduce through the runtime runs it: describe, pack and views.
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    backend = strategy.backend
    assert isinstance(backend, NumpyBackend)
    assert backend._cpass is _backend._CPASS
    counting = _Counting(backend._cpass)
    backend._cpass = counting  # type: ignore[assignment]

    results: dict[int, list[np.ndarray]] = {}  # type: ignore[type-arg]

    async def step(xs: list[np.ndarray]) -> None:  # type: ignore[type-arg]
        ctx = ar.get_replica_context()
        assert ctx is not None
        results[ctx.replica_id_in_sync_group] = await ctx.all_reduce("sum", xs)

    batch = ar.PerReplica([[np.full(3, r + j, np.float32) for j in range(5)] for r in range(2)])
    anyio.run(lambda: strategy.run(step, args=(batch,)))
    for r in range(2):
        assert [leaf.tolist() for leaf in results[r]] == [[2 * j + 1.0] * 3 for j in range(5)]
    assert counting.calls == {"describe": 2, "pack": 2, "views": 1}


def test_doctor_says_which_batch_pass_runs() -> None:
    from asyncreplica_numpy import _backend

    diagnosis = diagnose()
    assert diagnosis.batch_pass == _backend.batch_pass()
    assert render_text(diagnosis).splitlines()[4] == f"batch pass: {_backend.batch_pass()}"
    assert diagnosis.as_dict()["batch_pass"] == _backend.batch_pass()


def _c_reason_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, info: object, source: pathlib.Path
) -> str | None:
    record = tmp_path / "_build_info.json"
    record.write_text(json.dumps(info))
    monkeypatch.setattr(_compiled, "_BUILD_INFO", record)
    monkeypatch.delenv(_compiled.ENV_VAR, raising=False)
    return _compiled.c_extension_reason(CPASS, source)


def test_the_c_pass_runs_only_as_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    source = tmp_path / "_cpass.c"
    source.write_text("/* the C pass */\n")
    built = {"status": "compiled", "reason": "", "source": _compiled._digest(source)}
    info = {"status": "failed", "c_extensions": {CPASS: built}, "editable": True}
    assert _c_reason_with(monkeypatch, tmp_path, info, source) is None  # mypyc's failure aside
    assert _c_reason_with(monkeypatch, tmp_path, info, tmp_path / "absent.c") is None  # a wheel
    source.write_text("/* the C pass, edited */\n")
    assert _c_reason_with(monkeypatch, tmp_path, info, source) == (
        f"{tmp_path.name}/_cpass.c changed since it was compiled; "
        "reinstall (pip install -e .) to compile it again"
    )
    unavailable = {"status": "unavailable", "reason": "no C compiler ('/nonexistent' not found)"}
    info = {"status": "unavailable", "c_extensions": {CPASS: unavailable}}
    assert _c_reason_with(monkeypatch, tmp_path, info, source) == (
        "not compiled at install (unavailable: no C compiler ('/nonexistent' not found))"
    )
    old = {"status": "compiled", "modules": []}  # a record from before the C pass
    assert _c_reason_with(monkeypatch, tmp_path, old, source) == (
        "not built at install (the build did not know it)"
    )
    assert _c_reason_with(monkeypatch, tmp_path, [], source) == (
        "no build record (_build_info.json): not installed with pip"
    )
    source.write_text("/* the C pass */\n")
    info = {"status": "compiled", "c_extensions": {CPASS: built}}
    assert _c_reason_with(monkeypatch, tmp_path, info, source) is None
    monkeypatch.setenv(_compiled.ENV_VAR, "1")
    assert _compiled.c_extension_reason(CPASS, source) == f"{_compiled.ENV_VAR}=1 at run time"


_BATCH_PROBE = """
import json, numpy as np, anyio
import asyncreplica, asyncreplica as ar, asyncreplica_numpy
from asyncreplica._tools._doctor import diagnose
strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
batch = ar.PerReplica([[np.full(4, r * j, np.int32) for j in range(50)] for r in range(3)])
means = {}
async def step(xs):
    ctx = ar.get_replica_context()
    means[ctx.replica_id_in_sync_group] = await ctx.all_reduce("mean", xs)
anyio.run(lambda: strategy.run(step, args=(batch,)))
print(json.dumps({
    "packages": [asyncreplica.__file__, asyncreplica_numpy.__file__],
    "batch_pass": diagnose().batch_pass,
    "means": [[leaf.tolist() for leaf in means[r]] for r in range(3)],
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # pip makes a build environment (hatchling only: nothing to compile)
@pytest.mark.skipif(NO_EXTENSIONS, reason="builds a wheel: once per CI run is enough")
def test_a_wheel_built_without_a_compiler_installs_and_runs_the_python_batch_pass(
    tmp_path: pathlib.Path,
) -> None:
    wheel, log = _build_wheel(tmp_path, CC="/nonexistent")
    assert (
        f"asyncreplica: {CPASS} not compiled (unavailable: no C compiler ('/nonexistent' not "
        "found)); its pure-Python counterpart runs"
    ) in log
    assert "asyncreplica_numpy/_cpass.c" in wheel.namelist()
    info = json.loads(wheel.read("asyncreplica/_build_info.json"))
    assert info["c_extensions"][CPASS]["status"] == "unavailable"
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            wheel.filename,
        ],
        check=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop(_compiled.ENV_VAR, None)
    out = subprocess.run(
        [sys.executable, "-c", _BATCH_PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,  # not the source tree, which `python -c` would import first
    )
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert all(path.startswith(str(site)) for path in data["packages"]), data["packages"]
    assert data["batch_pass"] == (
        "interpreted: not compiled at install (unavailable: no C compiler ('/nonexistent' not found))"
    )
    assert data["means"] == [[[float(j)] * 4 for j in range(50)]] * 3
