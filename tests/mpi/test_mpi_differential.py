"""P processes x k replicas give what one process with P*k replicas gives (under mpiexec).

One ``mpiexec`` launch per process count runs every layout (each process's replica
count: k = 1, 2, 3 and uneven ones) and, in each, many generated programs: collectives
in the step function, ``merge_call`` with cross-replica calls, cross-replica calls on
the run's results and on plain values, and faults (another collective, a skipped one, a
``SUM`` of a plain value). Each process compares its part of every result, and every
error, with a one-process ``MirroredStrategy`` of the same global replicas that it runs
itself (see ``programs/differential.py``), and the processes compare their errors with
each other. The seeds are fixed, so a failure reproduces with the command it prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncreplica._launch import find_mpiexec

pytest.importorskip("mpi4py", reason="the [mpi] extra (mpi4py, mpich) is not installed")

PROGRAM = Path(__file__).parent / "programs" / "differential.py"
HANG_GUARD_S = 120

# (processes, seed, programs per layout, layouts): about 20 s each on 2 loaded cores.
RUNS = {
    2: (7, 60, ["1,1", "2,2", "3,3", "2,1", "1,3"]),
    3: (11, 40, ["1,1,1", "2,2,2", "3,3,3", "1,2,3", "3,1,2", "2,1,1"]),
}


@pytest.mark.parametrize("processes", sorted(RUNS))
def test_processes_give_what_one_process_gives(processes: int) -> None:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install 'asyncreplica[mpi]' brings MPICH's)")
    seed, cases, layouts = RUNS[processes]
    args = [str(PROGRAM), str(seed), str(cases), *layouts]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("ASYNCREPLICA_TRACE", None)
    proc = subprocess.run(
        [mpiexec, "-n", str(processes), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=env,
        check=False,
    )
    output = proc.stdout + proc.stderr
    command = f"mpiexec -n {processes} python {' '.join(args)}"
    mismatches = [line for line in output.splitlines() if " MISMATCH " in line]
    assert not mismatches, f"{command}\n" + "\n".join(mismatches[:20])
    assert proc.returncode == 0, f"{command}\n{output[-4000:]}"
    for rank in range(processes):
        assert f"rank={rank} done" in output, output[-4000:]
        for layout in layouts:
            # every layout ran its programs and checked something on every process
            assert f"rank={rank} layout={layout} cases={cases} checks=" in output, output
    assert "Task exception was never retrieved" not in output, output
    assert "Traceback" not in output, output
