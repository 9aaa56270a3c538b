"""A floating-point error of one process's own combine acts alike on every process.

Under ``mpiexec`` (programs/fp_local.py), each process compares what its
``MultiWorkerMirroredStrategy`` gave with a one-process ``MirroredStrategy`` of every
global replica: under ``np.seterr(all="raise")`` the same ``FloatingPointError`` (not a
``ReplicaExitedError`` on the processes whose own combine did not overflow), under
``"warn"`` the same ``RuntimeWarning``s (not only on the process whose own combine
overflowed), and ``"ignore"`` none.
"""

from __future__ import annotations

from ast import literal_eval
from pathlib import Path

import pytest
from test_mpi_lifecycle import launch

PROGRAM = Path(__file__).parent / "programs" / "fp_local.py"

# (layout, API): layout 2,1 overflows in process 0's own combine, 1,2 in process 1's
# (and 1,1,2 in process 2's); reduce0's components overflow each on its own process.
CASES = [
    ("2,1", "SUM"),
    ("1,2", "SUM"),
    ("2,1", "PROD"),
    ("1,2", "MEAN"),
    ("2,1", "reduce_scatter"),
    ("1,2", "reduce"),
    ("1,1,2", "SUM"),
    ("2,1,1", "MEAN"),
    ("1,1,1", "reduce"),
]


def _outcomes(layout: str, api: str, how: str, tmp_path: Path) -> list[list[str]]:
    processes = len(layout.split(","))
    rc, logs, output = launch(
        layout, api, how, tmp_path=tmp_path, program=PROGRAM, processes=processes
    )
    assert rc == 0, output
    lines = [logs[r].splitlines() for r in range(processes)]
    for mine in lines:
        assert len(mine) == 3, output
        # the strategy is still usable, every process in step
        assert mine[2] == f"next {float(sum(map(int, layout.split(','))))}", output
    return lines


@pytest.mark.parametrize(("layout", "api"), CASES)
@pytest.mark.parametrize("how", ["raise", "warn", "ignore"])
def test_every_process_acts_as_one_process_on_a_local_combines_error(
    layout: str, api: str, how: str, tmp_path: Path
) -> None:
    lines = _outcomes(layout, api, how, tmp_path)
    for mine in lines:
        got, want = mine[0].removeprefix("mw "), mine[1].removeprefix("oracle ")
        assert got == want, lines
    if how == "raise":
        assert lines[0][0].startswith("mw FloatingPointError: overflow encountered in "), lines
    elif how == "warn":
        assert "warned ['overflow encountered in " in lines[0][0], lines
    else:
        assert lines[0][0].endswith("warned []"), lines


@pytest.mark.parametrize("api", ["batch", "batch2", "batch_mixed"])
@pytest.mark.parametrize("layout", ["1,1,1", "2,1"])
def test_a_batch_warns_as_often_as_one_process(layout: str, api: str, tmp_path: Path) -> None:
    # One process combines a batch's values of one dtype in one numpy call, which warns
    # once (and once per dtype); the processes reduced each value alone and warned once
    # per value (twice for [(v, d), (v, d)]). Now each kind once per dtype in the batch,
    # on every process: one process's warnings, in number too.
    lines = _outcomes(layout, api, "warn", tmp_path)
    for mine in lines:
        got, want = mine[0].removeprefix("mw "), mine[1].removeprefix("oracle ")
        assert got == want, lines
    expected = 2 if api == "batch_mixed" else 1
    assert lines[0][0].endswith(f"warned {['overflow encountered in add'] * expected}"), lines


@pytest.mark.parametrize("api", ["reduce0", "batch"])
def test_warnings_of_several_numpy_calls_are_the_same_kinds_on_every_process(
    api: str, tmp_path: Path
) -> None:
    # One process warns once per numpy call that met an error (reduce0: once per
    # replica's overflowing component; a batch: once per numpy combine); the processes
    # once per kind per collective, the same on every process (docs/scale-out.md).
    lines = _outcomes("1,1,1", api, "warn", tmp_path)
    for mine in lines:
        assert mine[0] == lines[0][0], lines
        got, want = mine[0].partition(" warned ")[::2], mine[1].partition(" warned ")[::2]
        assert got[0].removeprefix("mw ") == want[0].removeprefix("oracle "), lines
        assert set(literal_eval(got[1])) == set(literal_eval(want[1])) != set(), lines
