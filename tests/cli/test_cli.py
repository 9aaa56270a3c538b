"""Every subcommand of the ``asyncreplica`` command line, run in-process with ``main([...])``.

``tests/test_demo.py`` covers the demo's training output; this module covers ``demo
--bug`` and ``--trace``, ``doctor``, ``trace summarize|plot``, ``lint`` and ``bench``, the
help of each, and the exit-status rules (0 ok, 1 a problem found, 2 usage error or missing
dependency, as one line on stderr).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import ClassVar, get_args

import pytest

import asyncreplica as ar
from asyncreplica import _registry
from asyncreplica._tools import _cli
from asyncreplica._tools._cli import main
from asyncreplica._tools._demo import BugName
from asyncreplica._version import __version__
from asyncreplica.abc import Backend

SMALL = ["--samples", "130", "--batch-size", "64", "--epochs", "1"]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``asyncreplica ARGS`` in-process; return the status, stdout and stderr."""
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_line_error(err: str, command: str, *fragments: str) -> None:
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"asyncreplica {command}: error: "), err
    for fragment in fragments:
        assert fragment in err


def hide_module(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    """Make ``importlib.util.find_spec`` say that ``hidden`` is not installed."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == hidden else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# Missing optional dependencies: one line, exit 2 --------------------------------------------


def test_demo_backend_cupy_without_cupy_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` fails, as without CuPy

    status, out, err = run_main(capsys, "demo", "--backend", "cupy", *SMALL)

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "demo", "--backend cupy", "CuPy is not installed", "[gpu]")


def test_demo_unknown_backend_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_main(capsys, "demo", "--backend", "nunpy", *SMALL)

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "demo", "no backend named 'nunpy'")


def test_scale_out_example_without_mpiexec_says_so() -> None:
    # The example of docs/scale-out.md, started where neither the [mpi] extra's mpiexec nor
    # any other is found: one line naming what is missing, no traceback.
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mpi" / "train.py"
    code = (
        "import runpy, shutil\n"
        "shutil.which = lambda *args, **kwargs: None\n"
        f"runpy.run_path({str(example)!r}, run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "PMI_SIZE")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )

    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "mpiexec" in proc.stderr
    assert "pip install 'asyncreplica[mpi]'" in proc.stderr


# --help everywhere -----------------------------------------------------------------------

HELP = [
    [],
    ["demo"],
    ["doctor"],
    ["trace"],
    ["trace", "summarize"],
    ["trace", "plot"],
    ["lint"],
]


@pytest.mark.parametrize("command", HELP, ids=lambda c: " ".join(c) or "main")
def test_help(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    with pytest.raises(SystemExit) as exc_info:
        main([*command, "--help"])

    assert exc_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {' '.join(['asyncreplica', *command])}")


def test_main_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])

    out = capsys.readouterr().out
    for command in ("demo", "doctor", "trace", "lint", "bench"):
        assert f"\n    {command} " in out


def test_python_dash_m_asyncreplica_help() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "asyncreplica", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: asyncreplica")
    for command in ("demo", "doctor", "trace", "lint", "bench"):
        assert command in completed.stdout
    assert completed.stderr == ""


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["trace"], id="trace-without-action"),
        pytest.param(["trace", "show", "x.json"], id="unknown-trace-action"),
        pytest.param(["trace", "summarize"], id="summarize-without-file"),
        pytest.param(["trace", "plot", "x.json"], id="plot-without-output"),
        pytest.param(["lint"], id="lint-without-paths"),
        pytest.param(["doctor", "--yaml"], id="doctor-unknown-option"),
        pytest.param(["demo", "--bug", "typo"], id="unknown-bug"),
        pytest.param(["demo", "--trace"], id="trace-without-file"),
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc_info:
        main(args)

    assert exc_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "usage: asyncreplica" in captured.err
    assert "error:" in captured.err.splitlines()[-1]


# demo --bug ------------------------------------------------------------------------------


def test_swap_is_described_as_a_swap(capsys: pytest.CaptureFixture[str]) -> None:
    # Not "replica 1 made an extra collective": each replica waits at the name the other
    # issues second, and the message says to use the same order.
    status, out, err = run_main(capsys, "demo", "--bug", "swap", "--replicas", "2", *SMALL)

    assert status == 1
    assert "swapped order" in out
    assert "extra collective" not in err
    assert "skipped" not in err
    assert "replica 0 waits at its collective named 'grad_b'" in err
    assert "replica 1 waits at its collective named 'loss'" in err
    assert "Await named collectives in the same order on every replica" in err


# bug: (the exception, the start of its message, a fragment that names the cause)
BUG_ERRORS = {
    "skip": (ar.CollectiveMismatchError, "Replicas disagree", "replica 1 skipped"),
    # A swap is told as one: each waits for the name the other issues second.
    "swap": (ar.CollectiveDeadlockError, "Replicas 0, 1 wait for each other", "same order"),
    "shape": (ar.CollectiveMismatchError, "Replicas disagree", "shape differs"),
    "stall": (ar.CollectiveTimeoutError, "Timed out", "replica 1 did not arrive: awaiting at"),
}


def test_every_bug_is_offered_and_tested() -> None:
    assert set(_cli._BUGS) == set(get_args(BugName)) == set(BUG_ERRORS)


@pytest.mark.parametrize("bug", sorted(BUG_ERRORS))
def test_bug_prints_the_error_as_users_see_it_and_exits_1(
    capsys: pytest.CaptureFixture[str], bug: str
) -> None:
    error_type, start, fragment = BUG_ERRORS[bug]

    status, out, err = run_main(capsys, "demo", "--bug", bug, "--replicas", "3", *SMALL)

    assert status == 1
    lines = out.splitlines()
    assert lines[1] == "3 replicas on CPU:0, CPU:1, CPU:2, backend numpy, loop asyncio"
    assert lines[2].startswith("bug: replica 1")
    assert len(lines) == 3  # no epoch lines: the first step fails
    # The type name, then the message exactly as str() gives it (first line: the fact).
    assert err.startswith(f"{error_type.__name__}: {start}")
    assert fragment in err
    assert err.rstrip().endswith(f"run `asyncreplica explain {error_type.code}`.")


def test_bug_output_is_the_exceptions_str(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Catch the exception the demo prints and compare it with what was printed.
    from asyncreplica._tools import _demo

    caught: list[BaseException] = []
    real_format = _demo.format_error

    def format_error(error: BaseException) -> str:
        caught.append(error)
        return real_format(error)

    monkeypatch.setattr(_demo, "format_error", format_error)

    status, _, err = run_main(capsys, "demo", "--bug", "shape", "--replicas", "2", *SMALL)

    assert status == 1
    [error] = caught
    assert isinstance(error, ar.CollectiveMismatchError)
    assert error.fields == ("shape",)
    assert err == f"CollectiveMismatchError: {error}\n"


@pytest.mark.parametrize("loop", ["trio", "uvloop"])
def test_bug_on_other_loops(capsys: pytest.CaptureFixture[str], loop: str) -> None:
    pytest.importorskip(loop)

    status, _, err = run_main(capsys, "demo", "--bug", "swap", "--loop", loop, *SMALL)

    assert status == 1
    assert err.startswith("CollectiveDeadlockError: ")


def test_bug_needs_two_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_main(capsys, "demo", "--bug", "skip", "--replicas", "1")

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "demo", "--bug skip needs at least 2 replicas")


# demo --trace and trace summarize / plot -----------------------------------------------


@pytest.fixture(scope="module")
def demo_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of a successful demo run, written by ``demo --trace``."""
    path = tmp_path_factory.mktemp("trace") / "demo.json"
    assert main(["demo", "--replicas", "3", "--trace", str(path), *SMALL]) == 0
    return path


@pytest.fixture(scope="module")
def failed_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gzip-compressed trace of a demo run that failed (``--bug skip``)."""
    path = tmp_path_factory.mktemp("trace") / "failed.json.gz"
    assert main(["demo", "--bug", "skip", "--trace", str(path), *SMALL]) == 1
    return path


def test_demo_trace_writes_a_chrome_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "run.json"

    status, out, err = run_main(capsys, "demo", "--trace", str(path), *SMALL)

    assert status == 0
    assert err == ""
    assert out.splitlines()[-1] == f"trace: wrote {path} (open it in ui.perfetto.dev)"
    events = json.loads(path.read_text())["traceEvents"]
    # 3 steps of 4 replicas: one complete event per replica per all_reduce.
    collectives = [e for e in events if e.get("ph") == "X" and e.get("cat") == "collective"]
    assert len(collectives) == 3 * 4


def test_demo_trace_is_written_when_the_bug_fails_the_run(failed_trace: Path) -> None:
    with gzip.open(failed_trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]

    assert any("CollectiveMismatchError" in json.dumps(e) for e in events)


def test_demo_trace_into_a_missing_folder_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "no" / "such" / "t.json"

    status, out, err = run_main(capsys, "demo", "--trace", str(path), *SMALL)

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "demo", "does not exist")


def test_trace_summarize(capsys: pytest.CaptureFixture[str], demo_trace: Path) -> None:
    status, out, err = run_main(capsys, "trace", "summarize", str(demo_trace))

    assert status == 0
    assert err == ""
    assert out.strip()
    for replica in range(3):
        assert f"\n{replica:>7}" in out or f"replica {replica}" in out
    assert "Slowest rendezvous" in out
    assert "_demo.py:" in out  # the late replica's call site


def test_trace_summarize_of_a_failed_run(
    capsys: pytest.CaptureFixture[str], failed_trace: Path
) -> None:
    status, out, _ = run_main(capsys, "trace", "summarize", str(failed_trace))

    assert status == 0
    assert "failed: CollectiveMismatchError" in out
    assert "mismatched position: 0" in out


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(None, "no such file", id="missing"),
        pytest.param("not json", "is not a JSON trace", id="not-json"),
        pytest.param('{"events": []}', "is not a Chrome trace", id="not-a-trace"),
    ],
)
def test_trace_summarize_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, fragment: str
) -> None:
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)

    status, out, err = run_main(capsys, "trace", "summarize", str(path))

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "trace summarize", fragment)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
@pytest.mark.parametrize("which", ["demo_trace", "failed_trace"])
def test_trace_plot_writes_a_png(
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    which: str,
) -> None:
    trace: Path = request.getfixturevalue(which)
    output = tmp_path / "timeline.png"

    status, out, err = run_main(capsys, "trace", "plot", str(trace), "-o", str(output))

    assert (status, err) == (0, "")
    assert out == f"wrote {output}\n"
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_plot_without_matplotlib_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    demo_trace: Path,
    tmp_path: Path,
) -> None:
    hide_module(monkeypatch, "matplotlib")
    output = tmp_path / "timeline.png"

    status, out, err = run_main(capsys, "trace", "plot", str(demo_trace), "-o", str(output))

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "trace plot", "needs matplotlib", "pip install matplotlib")
    assert not output.exists()


def test_trace_plot_missing_input_or_output_folder(
    capsys: pytest.CaptureFixture[str], demo_trace: Path, tmp_path: Path
) -> None:
    status, _, err = run_main(
        capsys, "trace", "plot", str(tmp_path / "none.json"), "-o", str(tmp_path / "t.png")
    )
    assert status == 2
    assert_one_line_error(err, "trace plot", "no such file")

    status, _, err = run_main(
        capsys, "trace", "plot", str(demo_trace), "-o", str(tmp_path / "no" / "t.png")
    )
    assert status == 2
    assert_one_line_error(err, "trace plot", "does not exist")


# doctor ----------------------------------------------------------------------------------


def test_doctor_text(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "mpi4py")

    status, out, err = run_main(capsys, "doctor")

    assert status == 0
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"asyncreplica {__version__}"
    assert lines[1].startswith(f"python: {sys.version.split()[0]} (")
    assert "event loops:" in lines
    assert f"  asyncio: {sys.version.split()[0]} (standard library)" in lines
    for loop in ("trio", "uvloop"):
        expected = (
            f"  {loop}: {importlib.metadata.version(loop)}"
            if importlib.util.find_spec(loop)
            else f"  {loop}: not installed: pip install {loop}"
        )
        assert expected in lines
    assert "backends:" in lines
    assert any(
        line.startswith("  numpy: ok (asyncreplica_numpy:NumpyBackend")
        and line.endswith("default devices: CPU:0")
        for line in lines
    ), lines
    assert "MirroredStrategy() default devices: CPU:0" in lines
    assert lines[-1] == "MPI: not installed: pip install 'asyncreplica[mpi]'"


def test_doctor_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    hide_module(monkeypatch, "mpi4py")

    status, out, err = run_main(capsys, "doctor", "--json")

    assert (status, err) == (0, "")
    data = json.loads(out)
    assert data["version"] == __version__
    assert data["python"] == sys.version.split()[0]
    assert data["ok"] is True
    assert [loop["name"] for loop in data["loops"]] == ["asyncio", "uvloop", "trio"]
    assert data["loops"][0] == {
        "name": "asyncio",
        "installed": True,
        "version": sys.version.split()[0],
    }
    numpy = next(b for b in data["backends"] if b["name"] == "numpy")
    assert numpy["available"] is True
    assert numpy["error"] is None
    assert numpy["default_devices"] == ["CPU:0"]
    assert data["default_devices"] == ["CPU:0"]
    assert data["mpi"] == {
        "installed": False,
        "mpi4py_version": None,
        "library_version": None,
        "error": None,
        "hint": "pip install 'asyncreplica[mpi]'",
        "world_size": None,
        "thread_level": None,
        "launched": False,
    }


class UnavailableBackend(Backend):
    """Installed, but ``check_available`` says it cannot run here."""

    name: ClassVar[str] = "unavailable"

    @classmethod
    def check_available(cls) -> None:
        raise ar.BackendError("no frobnicator found on this machine")


UnavailableBackend.__abstractmethods__ = frozenset()  # never instantiated


def test_doctor_reports_load_errors_and_unavailable_backends(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = importlib.metadata.EntryPoint(
        "broken", "no_such_module_for_asyncreplica:Backend", _registry.GROUP
    )
    monkeypatch.setattr(_registry, "_entry_points", {**_registry._discover(), "broken": broken})
    monkeypatch.setattr(_registry, "_load_errors", {})
    monkeypatch.setitem(_registry._registered, "unavailable", UnavailableBackend)

    status, out, _ = run_main(capsys, "doctor")

    assert status == 0  # numpy still works
    lines = out.splitlines()
    assert (
        "  broken: unavailable (no_such_module_for_asyncreplica:Backend):"
        " ModuleNotFoundError: No module named 'no_such_module_for_asyncreplica'"
    ) in lines
    assert any(
        line.startswith("  unavailable: unavailable (")
        and "BackendError: no frobnicator found on this machine" in line
        for line in lines
    ), lines

    status, out, _ = run_main(capsys, "doctor", "--json")
    by_name = {b["name"]: b for b in json.loads(out)["backends"]}
    assert by_name["broken"]["available"] is False
    assert by_name["broken"]["error"].startswith("ModuleNotFoundError: ")
    assert by_name["unavailable"]["default_devices"] == []


def test_doctor_exits_1_when_no_backend_can_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_registry, "available_backends", lambda: ("unavailable",))
    monkeypatch.setitem(_registry._registered, "unavailable", UnavailableBackend)

    status, out, _ = run_main(capsys, "doctor")

    assert status == 1
    assert out.splitlines()[-1] == "no backend can run here: see the errors above"
    status, out, _ = run_main(capsys, "doctor", "--json")
    assert status == 1
    assert json.loads(out)["ok"] is False


# lint ------------------------------------------------------------------------------------

BUGGY = """\
import asyncreplica as ar


async def step(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        x = await ctx.all_reduce("sum", x)
    return x
"""

CLEAN = """\
import asyncreplica as ar


async def step(x):
    ctx = ar.get_replica_context()
    x = await ctx.all_reduce("sum", x)
    if ctx.replica_id_in_sync_group == 0:
        print(x)
    return x
"""


def test_lint_finds_a_collective_under_a_replica_branch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "buggy.py"
    path.write_text(BUGGY)

    status, out, err = run_main(capsys, "lint", str(path))

    assert status == 1
    assert err == ""
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{path}:7:")
    assert "line 6" in lines[0]
    assert lines[1] == "Found 1 problem."


def test_lint_clean_file_exits_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "clean.py"
    path.write_text(CLEAN)

    status, out, err = run_main(capsys, "lint", str(path))

    assert (status, out, err) == (0, "All checks passed.\n", "")


def test_lint_several_paths_and_folders(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(BUGGY)
    (tmp_path / "pkg" / "b.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)

    status, out, _ = run_main(capsys, "lint", str(tmp_path / "pkg"), str(tmp_path / "clean.py"))

    assert status == 1
    assert out.splitlines()[-1] == "Found 2 problems."


def test_lint_ignore_comment(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "ignored.py"
    path.write_text(BUGGY.replace('"sum", x)', '"sum", x)  # asyncreplica: ignore'))

    status, out, _ = run_main(capsys, "lint", str(path))

    assert (status, out) == (0, "All checks passed.\n")


def test_lint_missing_path_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = run_main(capsys, "lint", str(tmp_path / "nope.py"))

    assert status == 2
    assert out == ""
    assert_one_line_error(err, "lint", "nope.py", "no such file")


def test_lint_unreadable_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "binary.py"
    path.write_bytes(b"\xff\xfe\x00 not python")

    status, out, err = run_main(capsys, "lint", str(path))

    assert status == 2
    assert out.startswith(f"{path}:1:1: cannot read")
    assert_one_line_error(err, "lint", "could not be read")


def test_lint_syntax_error_is_a_finding(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")

    status, out, _ = run_main(capsys, "lint", str(path))

    assert status == 1
    assert "cannot parse" in out


# bench -----------------------------------------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("asyncreplica._tools._bench") is None,
    reason="asyncreplica._tools._bench is not in this build",
)
def test_bench_help(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["bench", "--help"])
    except SystemExit as exc:
        status = exc.code  # type: ignore[assignment]

    assert status == 0
    assert capsys.readouterr().out.startswith("usage: asyncreplica bench")


def test_bench_without_the_module_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hide_module(monkeypatch, "asyncreplica._tools._bench")

    status, out, err = run_main(capsys, "bench", "--quick")

    assert status == 2
    assert out == ""
    assert err == "asyncreplica bench: error: bench is not available in this build\n"


def test_bench_receives_the_arguments_after_bench(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[list[str]] = []

    class FakeBench:
        @staticmethod
        def main(argv: list[str]) -> int:
            received.append(argv)
            return 0

    monkeypatch.setitem(sys.modules, "asyncreplica._tools._bench", FakeBench)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: object())

    assert main(["bench", "--quick", "--json", "out.json"]) == 0
    assert received == [["--quick", "--json", "out.json"]]


def test_doctor_reports_mpi_world_and_thread_level(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mpi4py")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "MPI: mpi4py " in out
    assert "MPI world: 1 process (not launched by mpiexec); thread level" in out
