"""Call paths across processes: the whole path is part of what processes agree on.

Inside one process a swapped pair of calls of one helper is a "call site differs"
error; across processes it must be one too, however deep the differing frame is and
even when the two calls share a line or are made by helper tasks started from
different lines. Launches ``programs/callpath.py`` under mpiexec
(process 0 runs replicas 0 and 1, process 1 runs replica 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from asyncreplica_mpi._protocol import (
    PATH_FRAMES,
    differing_fields,
    fingerprint,
    signature_fields,
)

from asyncreplica._launch import find_mpiexec
from asyncreplica.abc import CallSite, CollectiveKind, LeafSpec, ReduceOp, Signature

PROGRAM = Path(__file__).parent / "programs" / "callpath.py"
HANG_GUARD_S = 90


def line(marker: str) -> int:
    """The line of ``callpath.py`` that ends with ``# marker: <marker>``."""
    lines = PROGRAM.read_text(encoding="utf-8").splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# marker: {marker}"))


def launch(scenario: str, tmp_path: Path) -> tuple[int, dict[int, str], str]:
    """Run the scenario on 2 processes; return the exit status and each rank's log."""
    pytest.importorskip("mpi4py", reason="the [mpi] extra (mpi4py, mpich) is not installed")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'asyncreplica[mpi]' brings MPICH's)")
    env = {**os.environ, "ASYNCREPLICA_TEST_OUT": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("ASYNCREPLICA_TRACE", None)
    proc = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(PROGRAM), scenario],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=env,
        check=False,
    )
    logs = {}
    for rank in range(2):
        log = tmp_path / f"rank{rank}.log"
        logs[rank] = log.read_text(encoding="utf-8") if log.exists() else ""
    return proc.returncode, logs, proc.stdout + proc.stderr


def _source_column(marker: str, needle: str, nth: int) -> int:
    text = PROGRAM.read_text(encoding="utf-8").splitlines()[line(marker) - 1]
    starts = [i for i in range(len(text)) if text.startswith(needle, i)]
    return starts[nth] + 1


# scenario -> words every rank's message must contain
MISMATCHES = {
    "helper_swap": [
        "Processes disagree about their 1st collective (position 0): call site differs.",
        f"callpath.py:{line('reduce')} in reduce <- ",
        f"callpath.py:{line('swap-0')} in helper_swap",
        f"callpath.py:{line('swap-1')} in helper_swap",
    ],
    "deep_swap": [
        "call site differs",
        f"callpath.py:{line('deep')} in through <- ... (10 frames in common) <- ",
        f"callpath.py:{line('deep-0')} in deep_swap",
        f"callpath.py:{line('deep-1')} in deep_swap",
    ],
    "task_swap": [
        "call site differs",
        f"callpath.py:{line('reduce')} in reduce <- ",
        f"callpath.py:{line('task')} in in_task <- ",
        f"callpath.py:{line('task-0')} in task_swap",
        f"callpath.py:{line('task-1')} in task_swap",
    ],
    "same_line": [
        "call site differs",
        f"callpath.py:{line('line')}:{_source_column('line', 'f(', 0)} in same_line",
        f"callpath.py:{line('line')}:{_source_column('line', 'f(', 2)} in same_line",
    ],
}


@pytest.mark.parametrize("scenario", sorted(MISMATCHES))
def test_a_call_path_mismatch_raises_on_every_process(scenario: str, tmp_path: Path) -> None:
    rc, logs, output = launch(scenario, tmp_path)
    assert rc != 0, output
    for rank in (0, 1):
        assert logs[rank].startswith("raised CollectiveMismatchError\n"), (rank, logs[rank], output)
        for word in MISMATCHES[scenario]:
            assert word in logs[rank], (rank, word, logs[rank])


def test_deep_paths_that_agree_run_and_sum_right(tmp_path: Path) -> None:
    rc, logs, output = launch("deep_agree", tmp_path)
    assert rc == 0, output
    # 3 replicas: 3 x 1, 3 x 2, 3 x 3.
    assert logs[0] == "result [[3.0, 6.0, 9.0], [3.0, 6.0, 9.0]]\n", logs[0]
    assert logs[1] == "result [[3.0, 6.0, 9.0]]\n", logs[1]


# -- the fingerprint, without processes --------------------------------------------------


def _signature(path: tuple[CallSite, ...], name: str | None = None) -> Signature:
    return Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        name=name,
        leaves=(LeafSpec((3,), "float64"),),
        call_path=path,
    )


def _deep(n: int, differ_at: int | None = None, column: int = 5) -> tuple[CallSite, ...]:
    return tuple(
        CallSite("/p/train.py", 100 if i == differ_at else 10 + i, f"f{i}", column)
        for i in range(n)
    )


def _fp(signature: Signature) -> int:
    return fingerprint(signature_fields(signature, 0, check_call_sites=True))


@pytest.mark.parametrize("depth", [2, PATH_FRAMES, PATH_FRAMES + 1, 200])
def test_the_fingerprint_covers_every_frame_of_the_path(depth: int) -> None:
    same = _fp(_signature(_deep(depth)))
    assert _fp(_signature(_deep(depth))) == same
    for i in {0, depth // 2, depth - 1}:
        assert _fp(_signature(_deep(depth, differ_at=i))) != same, i
    assert _fp(_signature(_deep(depth, column=9))) != same  # calls on one line
    assert _fp(_signature(_deep(depth + 1))) != same


def test_only_the_first_frames_travel_whatever_the_depth() -> None:
    fields = signature_fields(_signature(_deep(500)), 0, check_call_sites=True)
    assert len(fields["call path"]["frames"]) == PATH_FRAMES
    assert fields["call path"]["more"] == 500 - PATH_FRAMES


def test_names_and_disabled_checks_leave_the_path_out() -> None:
    a, b = _deep(3), _deep(3, differ_at=2)
    for sig_a, sig_b, check in [
        (_signature(a, "g"), _signature(b, "g"), True),
        (_signature(a), _signature(b), False),
    ]:
        fields_a = signature_fields(sig_a, 0, check_call_sites=check)
        fields_b = signature_fields(sig_b, 0, check_call_sites=check)
        assert fingerprint(fields_a) == fingerprint(fields_b)


def test_a_path_that_differs_below_the_call_site_is_a_call_site_difference() -> None:
    details = [
        {"fields": signature_fields(_signature(p), 0, check_call_sites=True)}
        for p in (_deep(4), _deep(4, differ_at=3))
    ]
    assert differing_fields(details) == ["call site"]
