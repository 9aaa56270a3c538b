"""The build hook's fallback: a compiler that fails is found first, and recorded in short.

These call hatch_build.py's functions in this process (hatchling's hook interface is
stubbed: it lives in pip's isolated build environment), so a build with ``CC=/bin/false``
is checked in a second, without pip or mypyc. tests/test_compiled.py builds real wheels.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import sys
import types
from typing import Any

import pytest

from asyncreplica import _compiled

ROOT = pathlib.Path(__file__).resolve().parent.parent
FALSE = shutil.which("false") or "/bin/false"


class _Interface:
    """Stands in for hatchling's BuildHookInterface: the attributes the hook reads."""

    def __init__(self, root: pathlib.Path, config: dict[str, Any], target_name: str) -> None:
        self.root = str(root)
        self.config = config
        self.target_name = target_name


def _load_hook() -> types.ModuleType:
    names = ["hatchling", "hatchling.builders", "hatchling.builders.hooks"]
    names += ["hatchling.builders.hooks.plugin", "hatchling.builders.hooks.plugin.interface"]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names:
            sys.modules[name] = types.ModuleType(name)
        sys.modules[names[-1]].BuildHookInterface = _Interface  # type: ignore[attr-defined]
        spec = importlib.util.spec_from_file_location(
            "asyncreplica_hatch_build", ROOT / "hatch_build.py"
        )
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


HOOK = _load_hook()


@pytest.fixture(autouse=True)
def _fresh_probe() -> None:
    HOOK._toolchain_problem.cache_clear()


def _modules() -> list[str]:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    hooks = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]
    modules: list[str] = hooks["modules"]
    return modules


def test_a_compiler_that_fails_is_found_before_mypyc(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", FALSE)
    monkeypatch.delenv(HOOK.ENV_VAR, raising=False)

    def no_mypyc(*args: object) -> dict[str, Any]:
        raise AssertionError("mypyc ran although the compiler fails")

    monkeypatch.setattr(HOOK.MypycBuildHook, "_compile", no_mypyc)
    monkeypatch.setattr(HOOK.MypycBuildHook, "_build_c", no_mypyc)
    hook = HOOK.MypycBuildHook(ROOT, {"modules": _modules()}, "wheel")
    assert hook.dependencies() == []  # nor is mypy installed into the build environment
    build_data: dict[str, Any] = {"force_include": {}}
    hook.initialize("standard", build_data)
    try:
        (path,) = [
            p for p, target in build_data["force_include"].items() if target == HOOK.BUILD_INFO
        ]
        record = json.loads(pathlib.Path(path).read_text())
    finally:
        hook.finalize("standard", build_data, "")
    reason = f"the C compiler {FALSE!r} failed on a test file (exit 1)"
    assert (record["status"], record["reason"]) == ("unavailable", reason)
    assert record["editable"] is False
    assert FALSE in record["detail"]  # the command line is kept, out of the reason
    c_record = record["c_extensions"]["asyncreplica_numpy._cpass"]
    assert (c_record["status"], c_record["reason"]) == ("unavailable", reason)
    err = capsys.readouterr().err
    assert f"installing pure Python, not compiled (unavailable: {reason})" in err
    assert len(err.splitlines()) == 2  # one notice for mypyc, one for the C pass


def test_the_probe_passes_with_a_working_compiler() -> None:
    import sysconfig

    cc = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        pytest.skip(f"no C compiler ({cc}) here")
    include = sysconfig.get_paths()["include"]
    if not pathlib.Path(include, "Python.h").is_file():
        pytest.skip("no Python headers here")
    assert HOOK._toolchain_problem(cc, include) is None


def test_a_missing_compiler_or_header_is_named() -> None:
    assert HOOK._toolchain_problem("/nonexistent/cc -O2", "/x") == (
        "no C compiler ('/nonexistent/cc' not found)",
        "",
    )
    assert HOOK._toolchain_problem(FALSE, "/nonexistent") == (
        "no Python headers (Python.h not in /nonexistent)",
        "",
    )


def test_a_failed_c_build_records_the_error_not_the_command_line() -> None:
    command = "gcc -pthread -Wsign-compare -Werror=format-security " + "-I/x " * 120 + "-c _cpass.c"
    log = f"{command}\n_cpass.c:12:5: error: unknown type name 'foo'\n"
    failure = HOOK._failure("C compiler failed", RuntimeError("exit status 1"), log, ": error:")
    assert failure["reason"] == "C compiler failed: _cpass.c:12:5: error: unknown type name 'foo'"
    assert command in failure["detail"]
    bare = HOOK._failure(
        "C compiler failed", RuntimeError("command 'gcc' failed"), command, ": error:"
    )
    assert bare["reason"] == "C compiler failed: RuntimeError: command 'gcc' failed"
    assert len(HOOK._short("x" * 1000)) == HOOK.REASON_CHARS


def test_a_failed_mypyc_build_records_its_error_not_its_first_warning() -> None:
    log = (
        "asyncreplica/_core/_report.py:40: warning: Treating generator comprehension as list\n"
        "error: command '/usr/bin/gcc' failed with exit code 1\n"
    )
    failure = HOOK._failure(
        "mypyc build failed", SystemExit("error: command failed"), log, ": error:"
    )
    assert "_report.py" not in failure["reason"]
    assert failure["reason"] == "mypyc build failed: SystemExit: error: command failed"
    log = "asyncreplica/_core/_match.py:7: error: Name 'x' is not defined\n" + log
    failure = HOOK._failure("mypyc build failed", SystemExit(1), log, ": error:")
    assert failure["reason"] == (
        "mypyc build failed: asyncreplica/_core/_match.py:7: error: Name 'x' is not defined"
    )


# What the run-time side says about a build record ------------------------------------


def _decide(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, info: object) -> str:
    record = tmp_path / "_build_info.json"
    record.write_text(json.dumps(info))
    monkeypatch.setattr(_compiled, "_BUILD_INFO", record)
    monkeypatch.delenv(_compiled.ENV_VAR, raising=False)
    return _compiled._decide().describe()


@pytest.mark.parametrize(
    ("editable", "hint"),
    [
        (True, "reinstall (pip install -e .) to compile it again"),
        (
            False,
            (
                "the installed copy was edited; reinstall asyncreplica "
                "(pip install --force-reinstall) to compile it again"
            ),
        ),
    ],
)
def test_the_stale_source_hint_fits_the_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, editable: bool, hint: str
) -> None:
    sources = {"asyncreplica._core._ledger": "00000000-1"}
    info = {
        "status": "compiled",
        "modules": list(sources),
        "sources": sources,
        "editable": editable,
    }
    assert _decide(monkeypatch, tmp_path, info) == (
        f"interpreted: _core/_ledger.py changed since it was compiled; {hint}"
    )


def test_a_zip_import_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    archive = tmp_path / "app.zip"
    archive.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    monkeypatch.setattr(_compiled, "_HERE", archive / "asyncreplica")
    monkeypatch.setattr(_compiled, "_BUILD_INFO", archive / "asyncreplica" / "_build_info.json")
    expected = "imported from the zip archive app.zip, where extension modules cannot load"
    assert _compiled._decide().describe() == f"interpreted: {expected}"
    assert _compiled.c_extension_reason("asyncreplica_numpy._cpass", tmp_path / "x.c") == expected


def test_doctor_names_where_the_build_output_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    from asyncreplica._tools._doctor import diagnose, render_text

    record = tmp_path / "_build_info.json"
    info = {
        "status": "failed",
        "reason": "mypyc build failed: x",
        "detail": "the log",
        "modules": [],
    }
    record.write_text(json.dumps(info))
    monkeypatch.setattr(_compiled, "_BUILD_INFO", record)
    assert _compiled.build_output() == f'"detail" in {record}'
    assert f'build output: "detail" in {record}' in render_text(diagnose()).splitlines()
    record.write_text(json.dumps({**info, "detail": ""}))
    assert _compiled.build_output() == ""
