"""A collective error's default traceback shows the user's frames, not asyncreplica's.

The full chain stays one environment variable away (ASYNCREPLICA_FULL_TRACEBACK=1), and
the error's note says so. Each case runs a script in a fresh interpreter and reads the
traceback Python prints for the uncaught error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import asyncreplica as ar

PACKAGE = Path(ar.__file__).resolve().parent
FRAME = re.compile(r'^  File "([^"]+)", line \d+, in (\S+)$', re.MULTILINE)

SCRIPTS = {
    "exited": """
import asyncio
import asyncreplica as ar

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

async def step(x):
    ctx = ar.get_replica_context()
    if ctx.replica_id_in_sync_group == 0:
        return x
    return await ctx.all_reduce("sum", x)

async def main():
    return await strategy.run(step, args=(1.0,))

asyncio.run(main())
""",
    "mismatch-in-a-helper": """
import asyncreplica as ar
import anyio

strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])

async def reduce_twice(ctx, x):
    op = "max" if ctx.replica_id_in_sync_group == 2 else "sum"
    return await ctx.all_reduce(op, x)

async def step(x):
    return await reduce_twice(ar.get_replica_context(), x)

async def main():
    await strategy.run(step, args=(1.0,))

anyio.run(main, backend="trio")
""",
}


def _run(script: str, tmp_path: Path, **env: str) -> tuple[list[tuple[str, str]], str]:
    path = tmp_path / "train.py"
    path.write_text(script, encoding="utf-8")
    environment = {k: v for k, v in os.environ.items() if k != "ASYNCREPLICA_FULL_TRACEBACK"}
    proc = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environment, **env},
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    return FRAME.findall(proc.stderr), proc.stderr


def _library(frames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(f, fn) for f, fn in frames if Path(f).resolve().is_relative_to(PACKAGE)]


@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_default_traceback_has_only_the_users_frames(case: str, tmp_path: Path) -> None:
    if "trio" in SCRIPTS[case]:
        pytest.importorskip("trio")
    frames, stderr = _run(SCRIPTS[case], tmp_path)

    assert _library(frames) == []
    user = [fn for f, fn in frames if Path(f).name == "train.py"]
    assert user[-1] in ("step", "reduce_twice")  # the line that awaited the collective
    assert "main" in user
    assert "set ASYNCREPLICA_FULL_TRACEBACK=1 to show them" in stderr
    assert stderr.rstrip().endswith("to show them)")
    assert len(stderr.splitlines()) < 40, stderr


def test_the_full_traceback_on_request(tmp_path: Path) -> None:
    frames, stderr = _run(SCRIPTS["exited"], tmp_path, ASYNCREPLICA_FULL_TRACEBACK="1")

    names = {Path(f).name for f, _ in _library(frames)}
    assert {"_run.py", "_ledger.py"} <= names
    assert "ASYNCREPLICA_FULL_TRACEBACK=1 to show them" not in stderr


def test_a_caught_error_keeps_its_type_attributes_and_message() -> None:
    import asyncio

    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])

    async def step() -> object:
        ctx = ar.get_replica_context()
        if ctx.replica_id_in_sync_group == 0:
            return None
        return await ctx.all_reduce("sum", 1.0)

    with pytest.raises(ar.ReplicaExitedError) as info:
        asyncio.run(strategy.run(step))

    assert info.value.replica_id == 0
    assert (
        info.value.__notes__.count(
            "(asyncreplica's own frames are hidden from this traceback;"
            " set ASYNCREPLICA_FULL_TRACEBACK=1 to show them)"
        )
        == 1
    )
    # The traceback still reaches the step function's line.
    tb = info.value.__traceback__
    functions = []
    while tb is not None:
        functions.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert functions[-1] == "step"
