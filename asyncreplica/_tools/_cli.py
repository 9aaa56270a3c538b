"""The ``asyncreplica`` command line (also ``python -m asyncreplica``).

Subcommands:

* ``demo``: data-parallel logistic regression on N CPU replicas, checked against a
  single-replica run (see :mod:`asyncreplica._tools._demo`); ``--bug NAME`` runs a step with one
  class of bug and prints the error asyncreplica raises for it; ``--trace FILE`` writes a
  Chrome trace of the runs.
* ``doctor``: the version, Python, event loops, backends (with their load errors and
  default devices) and MPI support of this installation (see :mod:`asyncreplica._tools._doctor`).
* ``trace summarize FILE`` and ``trace plot FILE -o PNG``: read a trace written by
  ``strategy.trace()``, ``demo --trace`` or ``ASYNCREPLICA_TRACE``.
* ``lint PATH...``: flag collectives under conditions that depend on the replica.
* ``explain [CODE]``: what an error code (``AR103``, as every error message ends) means,
  with a broken and a fixed program, like ``rustc --explain``; without a code, the list.
* ``bench``: measure the collectives (options after ``bench`` belong to it).

Exit status:

* 0: success (demo weights match; doctor found a usable backend; lint found nothing);
* 1: the command ran and found a problem: the demo's weights do not match, a ``--bug``
  run (always: it shows an error), no usable backend (doctor), findings (lint);
* 2: a usage error (argparse, or an argument that cannot work: an unknown backend, an
  unavailable event loop, a path that cannot be read or written, a file that is not a
  trace, an unknown error code) or a missing optional dependency (CuPy or a GPU for
  ``demo --backend cupy``, mpi4py or mpiexec for ``--mpi``, matplotlib for ``trace plot``,
  the benchmark module for ``bench``). Every such error is one line on stderr, starting
  ``asyncreplica COMMAND: error:``, except argparse's, which prints the usage first.

Modules behind a subcommand (numpy, the runtime, tracing, lint, matplotlib) are imported
only when that subcommand runs, so ``--help`` and ``doctor`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING

from asyncreplica._launch import find_mpiexec, launched_by_mpiexec
from asyncreplica._version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable

    from asyncreplica._tools._demo import BugName, LoopName

__all__ = ["main"]

PROG = "asyncreplica"
_LOOP_PACKAGES = {"asyncio": None, "trio": "trio", "uvloop": "uvloop"}
_BUGS = ("skip", "swap", "shape", "stall")  # asyncreplica._tools._demo.BugName, without numpy
_ARGUMENTS: list[str] = []  # the command line being run
_BENCH_MODULE = "asyncreplica._tools._bench"

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    """Parse a command-line integer that must be at least 1 (argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    """Parse a command-line number that must be greater than 0 (argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="data-parallel logistic regression on N CPU replicas",
        description=(
            "Train logistic regression on a seeded synthetic data set (two Gaussian blobs)"
            " data-parallel on N CPU replicas: every replica takes a contiguous shard of each"
            " global batch, the gradients are summed with all_reduce, and every replica applies"
            " the same update. The result is compared with a plain single-replica numpy run."
            " Exit status 0 when the weights match, 1 when they do not. With --bug, replica 1"
            " makes one class of mistake in its training step and the command prints the"
            " error asyncreplica raises for it, as a user would see it, and exits 1."
        ),
    )
    demo.add_argument(
        "--replicas",
        type=_positive_int,
        default=4,
        metavar="N",
        help="number of replicas, on devices CPU:0..CPU:N-1 (default: %(default)s)",
    )
    demo.add_argument(
        "--epochs",
        type=_positive_int,
        default=5,
        metavar="N",
        help="passes over the data set (default: %(default)s)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=64,
        metavar="N",
        help="global batch size, over all replicas (default: %(default)s)",
    )
    demo.add_argument(
        "--samples",
        type=_positive_int,
        default=4000,
        metavar="N",
        help="samples in the synthetic data set (default: %(default)s)",
    )
    demo.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=0.1,
        metavar="LR",
        help="gradient descent step size (default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the data set and its shuffles (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        default="numpy",
        metavar="NAME",
        help="asyncreplica backend that reduces the arrays (default: %(default)s)",
    )
    demo.add_argument(
        "--loop",
        choices=list(_LOOP_PACKAGES),
        default="asyncio",
        help="event loop to run the replicas on (default: %(default)s)",
    )
    demo.add_argument(
        "--bug",
        choices=_BUGS,
        help=(
            "run a training step in which replica 1 makes a mistake, and print the error it"
            " causes: skip (skips the gradient all_reduce), swap (issues two named"
            " collectives in the other order), shape (its gradient has another shape), stall (awaits something"
            " that never happens; collectives time out after 0.5 s); needs 2+ replicas"
        ),
    )
    demo.add_argument(
        "--trace",
        metavar="FILE",
        help=(
            "write a Chrome trace of the runs to FILE (gzip if it ends in .gz); open it in"
            " ui.perfetto.dev or read it with 'asyncreplica trace summarize FILE'"
        ),
    )
    demo.add_argument(
        "--mpi",
        action="store_true",
        help=(
            "train across MPI processes with MultiWorkerMirroredStrategy (needs the [mpi]"
            " extra): relaunches itself under 'mpiexec -n P'; under mpiexec this is the"
            " default. --replicas is then the global count, split over the processes"
        ),
    )
    demo.add_argument(
        "--processes",
        type=_positive_int,
        default=2,
        metavar="P",
        help="MPI processes for --mpi (default: %(default)s)",
    )
    demo.set_defaults(handler=_run_demo)


def _add_doctor(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="what this installation can run: loops, backends, devices, MPI",
        description=(
            "Report the asyncreplica and Python versions, the event loops available, every"
            " backend found with its load error or default devices, and MPI support."
            " Exit status 0 when at least one backend can run, 1 otherwise."
        ),
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=_run_doctor)


def _add_trace(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trace = commands.add_parser(
        "trace",
        help="summarize or plot a trace written by strategy.trace() or demo --trace",
        description=(
            "Read a Chrome trace-event file written by strategy.trace(FILE), 'asyncreplica"
            " demo --trace FILE' or ASYNCREPLICA_TRACE=FILE."
        ),
    )
    actions = trace.add_subparsers(dest="action", metavar="ACTION", required=True)
    summarize = actions.add_parser(
        "summarize",
        help="per replica: collectives, waiting time, late arrivals; the slowest rendezvous",
        description=(
            "Print, per replica, its collectives, its total time waiting and how often it"
            " arrived last; the slowest rendezvous with the late replica and its call site;"
            " and the mismatched positions if the run failed."
        ),
    )
    summarize.add_argument("file", metavar="FILE", help="the trace file (.json or .json.gz)")
    summarize.set_defaults(handler=_run_trace_summarize)
    plot = actions.add_parser(
        "plot",
        help="draw the timeline as a PNG (needs matplotlib)",
        description=(
            "Draw replicas as rows and collectives as bars, late arrivals highlighted, into a"
            " PNG file. Needs matplotlib; exit status 2 when it is not installed."
        ),
    )
    plot.add_argument("file", metavar="FILE", help="the trace file (.json or .json.gz)")
    plot.add_argument(
        "-o",
        "--output",
        metavar="PNG",
        required=True,
        help="where to write the picture, e.g. timeline.png",
    )
    plot.add_argument(
        "--run",
        default="failed",
        metavar="RUN",
        help=(
            "which run to draw: 'failed' (default: the last run that failed, or every run"
            " when none did), 'all', or a run's index as the summary names it"
        ),
    )
    plot.set_defaults(handler=_run_trace_plot)


def _add_lint(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lint = commands.add_parser(
        "lint",
        help="flag collectives under conditions that depend on the replica",
        description=(
            "Statically check Python files (nothing is executed) for a collective inside a"
            " branch or loop whose condition depends on the replica id or on per-replica data."
            " '# asyncreplica: ignore' on a line silences it. Exit status 1 when something is"
            " found, 0 otherwise, 2 when a path cannot be read."
        ),
    )
    lint.add_argument("paths", nargs="+", metavar="PATH", help="Python files or folders")
    lint.set_defaults(handler=_run_lint)


def _add_explain(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = commands.add_parser(
        "explain",
        help="explain an error code such as AR103, with a broken and a fixed program",
        description=(
            "Print the explanation of an error code: when the error is raised, a real"
            " message, its attributes, and a broken and a fixed program. Every error"
            " asyncreplica raises ends with the command to run. A class name"
            " (ReplicaExitedError) works too; without a code, list the codes."
        ),
    )
    explain.add_argument("code", nargs="?", metavar="CODE", help="e.g. AR103")
    explain.set_defaults(handler=_run_explain)


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Only for the listing in --help: main() hands 'bench ...' to the benchmark's own parser.
    commands.add_parser(
        "bench",
        help="measure the collectives against baselines (see 'asyncreplica bench --help')",
        add_help=False,
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "tf.distribute's replica model (Strategy.run, all_reduce, merge_call) as coroutines"
            " on one event loop, with collectives that never hang."
        ),
        epilog=(
            "Exit status: 0 success, 1 the command found a problem, 2 usage error or missing"
            " dependency."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo(commands)
    _add_doctor(commands)
    _add_trace(commands)
    _add_lint(commands)
    _add_explain(commands)
    _add_bench(commands)
    return parser


def _error(command: str, message: str) -> int:
    """Print a one-line error for ``command`` on stderr and return exit status 2."""
    line = " ".join(message.split())
    print(f"{PROG} {command}: error: {line}", file=sys.stderr)
    return EXIT_USAGE


def _describe(error: BaseException) -> str:
    """``"message"`` of an ``OSError`` as the OS says it, else ``"TypeName: message"``."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename is not None else ""
        return f"{error.strerror}{where}"
    return f"{type(error).__name__}: {error}"


# -- demo -----------------------------------------------------------------------------------


def _run_demo(args: argparse.Namespace) -> int:
    """Run ``asyncreplica demo`` with parsed arguments and return its exit status."""
    loop: LoopName = args.loop
    package = _LOOP_PACKAGES[loop]
    if package is not None and importlib.util.find_spec(package) is None:
        return _error("demo", f"--loop {loop} needs the {package!r} package: pip install {package}")
    bug: BugName | None = args.bug
    if bug is not None and args.replicas < 2:
        return _error("demo", f"--bug {bug} needs at least 2 replicas, got --replicas 1")
    trace: str | None = args.trace
    if trace is not None:
        folder = os.path.dirname(os.path.abspath(trace))
        if not os.path.isdir(folder):
            return _error("demo", f"--trace {trace}: the folder {folder} does not exist")
    launched = launched_by_mpiexec()
    mpi = bool(args.mpi) or launched
    if mpi and importlib.util.find_spec("mpi4py") is None:
        return _error(
            "demo", "--mpi needs mpi4py and an MPI library: pip install 'asyncreplica[mpi]'"
        )
    if mpi and not launched:
        return _relaunch_under_mpiexec(args.processes)
    if mpi and trace is not None:
        return _error("demo", "--trace is not supported with --mpi yet")

    # Imported here: numpy and the strategy are only needed once a demo actually runs.
    import asyncreplica as ar
    from asyncreplica._registry import load_backend_class

    try:
        # A backend that is missing, or installed without what it needs (cupy without CuPy
        # or a GPU): one line, before anything runs.
        load_backend_class(args.backend).check_available()
    except (ar.BackendNotFoundError, ar.BackendError) as exc:
        return _error("demo", f"--backend {args.backend}: {exc}")
    from asyncreplica._tools._demo import DemoConfig, run_demo

    config = DemoConfig(
        replicas=args.replicas,
        epochs=args.epochs,
        batch_size=args.batch_size,
        samples=args.samples,
        seed=args.seed,
        learning_rate=args.learning_rate,
        backend=args.backend,
        bug=bug,
        mpi=mpi,
    )
    try:
        status = run_demo(config, loop=loop, trace=trace)
    except ar.BackendNotFoundError as exc:
        # The message names the backend, the available ones and how to install it.
        return _error("demo", str(exc))
    except OSError as exc:
        if trace is None:
            raise
        return _error("demo", f"cannot write the trace {trace}: {_describe(exc)}")
    if trace is not None:
        print(f"trace: wrote {trace} (open it in ui.perfetto.dev)")
    return status


def _relaunch_under_mpiexec(processes: int) -> int:
    """Run this same ``demo`` command on ``processes`` processes; return mpiexec's status."""
    import subprocess

    mpiexec = find_mpiexec()
    if mpiexec is None:
        return _error("demo", "--mpi needs mpiexec: pip install 'asyncreplica[mpi]' brings MPICH's")
    command = [mpiexec, "-n", str(processes), sys.executable, "-m", "asyncreplica", *_ARGUMENTS]
    sys.stdout.flush()
    return subprocess.run(command, check=False).returncode


# -- doctor ---------------------------------------------------------------------------------


def _run_doctor(args: argparse.Namespace) -> int:
    """Run ``asyncreplica doctor``: print the diagnosis; 1 when no backend can run."""
    from asyncreplica._tools._doctor import diagnose, render_text

    diagnosis = diagnose()
    if args.json:
        print(json.dumps(diagnosis.as_dict(), indent=2))
    else:
        print(render_text(diagnosis))
    return EXIT_OK if diagnosis.ok else EXIT_PROBLEM


# -- trace ----------------------------------------------------------------------------------


def _check_readable(command: str, path: str) -> int | None:
    """Return exit status 2 (after a one-line error) when ``path`` is not a readable file."""
    if not os.path.exists(path):
        return _error(command, f"{path}: no such file")
    if not os.path.isfile(path):
        return _error(command, f"{path}: not a file")
    if not os.access(path, os.R_OK):
        return _error(command, f"{path}: permission denied")
    return None


def _run_trace_summarize(args: argparse.Namespace) -> int:
    """Run ``asyncreplica trace summarize FILE``."""
    command = "trace summarize"
    path: str = args.file
    failed = _check_readable(command, path)
    if failed is not None:
        return failed
    from asyncreplica import _tracing

    try:
        text = _tracing.summarize(path)
    except ValueError as exc:  # not JSON, not a trace (gzip errors are OSErrors)
        return _error(command, str(exc))
    except OSError as exc:
        return _error(command, f"cannot read {path}: {_describe(exc)}")
    print(text.rstrip("\n"))
    return EXIT_OK


def _run_trace_plot(args: argparse.Namespace) -> int:
    """Run ``asyncreplica trace plot FILE -o PNG``; exit status 2 without matplotlib."""
    command = "trace plot"
    path: str = args.file
    output: str = args.output
    failed = _check_readable(command, path)
    if failed is not None:
        return failed
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        return _error(command, f"-o {output}: the folder {folder} does not exist")
    if importlib.util.find_spec("matplotlib") is None:
        return _error(command, "needs matplotlib, which is not installed: pip install matplotlib")
    from asyncreplica import _tracing

    run: int | str = args.run
    if isinstance(run, str) and run.isdigit():
        run = int(run)
    try:
        _tracing.plot(path, output, run=run)
    except ImportError as exc:  # matplotlib present but broken, or a backend of it missing
        return _error(command, f"needs matplotlib, which failed to import: {_describe(exc)}")
    except ValueError as exc:
        return _error(command, str(exc))
    except OSError as exc:
        return _error(command, f"cannot plot {path} to {output}: {_describe(exc)}")
    print(f"wrote {output}")
    return EXIT_OK


# -- lint -----------------------------------------------------------------------------------


def _run_lint(args: argparse.Namespace) -> int:
    """Run ``asyncreplica lint PATH...``: 1 when anything is found."""
    paths: list[str] = args.paths
    for path in paths:
        if not os.path.exists(path):
            return _error("lint", f"{path}: no such file or folder")
        if not os.access(path, os.R_OK):
            return _error("lint", f"{path}: permission denied")
    from asyncreplica._tools._lint import lint_paths

    try:
        findings = lint_paths(paths)
    except OSError as exc:  # a path vanished since the check above
        return _error("lint", _describe(exc))
    for finding in findings:
        print(finding)
    # The checker reports a file it cannot read as a finding without a condition.
    unreadable = [
        f for f in findings if f.condition_line is None and f.message.startswith("cannot read")
    ]
    count = len(findings) - len(unreadable)
    if unreadable:
        print(
            f"asyncreplica lint: error: {len(unreadable)} file(s) could not be read",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if count:
        print(f"Found {count} problem{'s' if count != 1 else ''}.")
        return EXIT_PROBLEM
    print("All checks passed.")
    return EXIT_OK


# -- explain --------------------------------------------------------------------------------


def _run_explain(args: argparse.Namespace) -> int:
    """Run ``asyncreplica explain [CODE]``: print the explanation, or list the codes."""
    from importlib import resources

    from asyncreplica._core._codes import CODES

    given: str | None = args.code
    if given is None:
        print("Error codes (asyncreplica explain CODE prints one):")
        for name, code in CODES.items():
            print(f"  {code}  {name}")
        return EXIT_OK
    names = {code: name for name, code in CODES.items()}
    by_name = {name.lower(): code for name, code in CODES.items()}
    code = given.strip().upper()
    if code not in names:
        code = by_name.get(given.strip().lower(), "")
    if not code:
        return _error(
            "explain",
            f"unknown error code {given!r}; the codes are {', '.join(names)}"
            " ('asyncreplica explain' lists them)",
        )
    text = resources.files("asyncreplica").joinpath("_explain", f"{code}.md").read_text("utf-8")
    print(text.rstrip("\n"))
    return EXIT_OK


# -- bench ----------------------------------------------------------------------------------


def _run_bench(argv: list[str]) -> int:
    """Hand ``asyncreplica bench ARGS`` to the benchmark module, if this build has it."""
    if "--mpi" in argv:
        return _run_bench_mpi([a for a in argv if a != "--mpi"])
    if importlib.util.find_spec(_BENCH_MODULE) is None:
        return _error("bench", "bench is not available in this build")
    try:
        bench = importlib.import_module(_BENCH_MODULE)
    except ImportError as exc:
        return _error("bench", f"bench failed to load: {_describe(exc)}")
    bench_main: Callable[[list[str]], int] = bench.main
    return bench_main(argv)


def _run_bench_mpi(argv: list[str]) -> int:
    """``asyncreplica bench --mpi``: relaunch under mpiexec, or run as one of its processes."""
    if importlib.util.find_spec("mpi4py") is None:
        return _error(
            "bench", "--mpi needs mpi4py and an MPI library: pip install 'asyncreplica[mpi]'"
        )
    if not launched_by_mpiexec():
        if any(a in ("-h", "--help") for a in argv):
            from asyncreplica._tools._bench_mpi import main as bench_mpi

            return bench_mpi(argv)
        processes = 2
        for i, a in enumerate(argv):
            if a == "--processes" and i + 1 < len(argv) and argv[i + 1].isdigit():
                processes = int(argv[i + 1])
            elif a.startswith("--processes=") and a.partition("=")[2].isdigit():
                processes = int(a.partition("=")[2])
        if processes < 1:
            return _error("bench", "--processes must be at least 1")
        status = _relaunch_under_mpiexec(processes)
        mpiexec = find_mpiexec()
        if status or mpiexec is None:
            return status
        # Then the fault latencies: one mpiexec job per kind of fault (one ends a process).
        from asyncreplica._tools._bench_mpi import faults_main

        return faults_main(argv, mpiexec, processes)
    from asyncreplica._tools._bench_mpi import main as bench_mpi

    return bench_mpi(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the ``asyncreplica`` command line.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status: 0 on success, 1 when the command found a problem (see the module
        docstring), 2 for a usage error or a missing optional dependency.

    Raises:
        SystemExit: As argparse does: status 2 on a usage error, 0 after ``--help`` or
            ``--version``.
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    _ARGUMENTS[:] = arguments  # for a relaunch under mpiexec (demo --mpi)
    if arguments[:1] == ["bench"]:
        return _run_bench(arguments[1:])
    args = _build_parser().parse_args(arguments)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`asyncreplica explain AR103 | head`): stop quietly, and keep
        # Python from reporting the pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
