"""ASYNCREPLICA_TRACE=FILE traces unmodified programs (checked in fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncreplica._tracing import ENV_VAR, load_trace

Check = Callable[[Any], None]

PROGRAM = textwrap.dedent(
    """
    import os
    import sys

    import anyio
    import asyncreplica as ar

    two = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    three = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])


    async def step():
        ctx = ar.get_replica_context()
        await ctx.all_reduce("sum", 1.0)
        await ctx.barrier()


    async def skips():
        ctx = ar.get_replica_context()
        if ctx.replica_id_in_sync_group == 0:
            await ctx.all_reduce("sum", 1.0)


    async def main():
        await two.run(step)
        await three.run(step)
        try:
            await two.run(skips)
        except ar.ReplicaExitedError:
            pass


    anyio.run(main, backend=sys.argv[1])
    if sys.argv[2] == "crash":
        os._exit(3)  # no atexit: only what was written after the runs is left
    """
)


def _run(tmp_path: Path, target: str, loop: str, end: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {**os.environ, ENV_VAR: target}
    return subprocess.run(
        [sys.executable, str(script), loop, end],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@pytest.mark.parametrize(("name", "end"), [("trace.json", "exit"), ("trace.json.gz", "crash")])
def test_the_environment_variable_traces_every_strategy(
    tmp_path: Path, check_trace: Check, loop: str, name: str, end: str
) -> None:
    # A relative path is resolved against the directory the program started in.
    proc = _run(tmp_path, name, loop, end)
    assert proc.returncode == (3 if end == "crash" else 0), proc.stderr
    assert proc.stderr == ""
    data = load_trace(tmp_path / name)
    check_trace(data)
    runs = [e["args"] for e in data["traceEvents"] if e.get("cat") == "run"]
    assert [(r["num_replicas"], r["status"]) for r in runs] == [
        (2, "ok"),
        (3, "ok"),
        (2, "failed"),
    ]
    (failure,) = data["otherData"]["failures"]
    assert failure["type"] == "ReplicaExitedError"
    assert len(failure["replicas"]) == 2
    line = PROGRAM.splitlines().index('        await ctx.all_reduce("sum", 1.0)') + 1  # in skips()
    assert failure["replicas"][0]["history"][0]["call_site"].endswith(f"/program.py:{line}")
    names = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert {"replica 0", "replica 1", "replica 2", "backend", "runs"} <= names
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_without_the_variable_nothing_is_written(tmp_path: Path) -> None:
    code = "import asyncreplica as ar; print(ar.MirroredStrategy(['CPU:0'])._tracer)"
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == "None"
    assert list(tmp_path.iterdir()) == []
