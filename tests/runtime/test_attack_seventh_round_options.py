"""Defects found by attack 23f (the seventh round): each test failed before its fix.

F1: ``stall_warning_seconds=math.nan`` was accepted; the first collective that waited
    then failed with anyio's raw ``ValueError: delay must be a non-negative number``.
F3: ``timeout_seconds`` refused numpy's float32 and integer scalars as "not a number"
    (float64 passed, as a float subclass) and let ``10**400`` escape as a raw
    ``OverflowError``. One rule, ``seconds_option``, now checks every number of seconds.
F4: ``trace summarize`` counted the runs of the surviving slices only: "0 collectives in
    1 run" above three failed runs when ``max_events`` had dropped their slices.
"""

from __future__ import annotations

import fractions
import math
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._tracing import summarize

DEVICES = ["CPU:0", "CPU:1"]

#: Every "number of seconds" option, with a valid value of each kind of real number.
REALS = [
    (0.5, 0.5),
    (2, 2.0),
    (np.float64(0.5), 0.5),
    (np.float32(0.5), 0.5),
    (np.float16(1.0), 1.0),
    (np.int64(3), 3.0),
    (np.uint8(3), 3.0),
    (fractions.Fraction(1, 4), 0.25),
    (math.inf, math.inf),
    (10**400, math.inf),  # beyond a float: for ever, as inf is
]

NOT_NUMBERS = [True, np.True_, "1", b"1", 1j, np.complex64(1), np.array(1.0), [1.0]]


def _stall(value: Any) -> ar.MirroredStrategy:
    return ar.MirroredStrategy(DEVICES, stall_warning_seconds=value)


def _timeout(value: Any) -> ar.CommunicationOptions:
    return ar.CommunicationOptions(timeout_seconds=value)


def _set_timeout(value: Any) -> ar.CommunicationOptions:
    options = ar.CommunicationOptions(timeout_seconds=1.0)
    options.timeout_seconds = value
    return options


def _mwms_stall(value: Any) -> object:
    # The check comes before mpi4py is needed, so it runs without it too.
    return ar.MultiWorkerMirroredStrategy(["CPU:0"], stall_warning_seconds=value)


SETTERS = {
    "MirroredStrategy(stall_warning_seconds=...)": ("stall_warning_seconds", _stall),
    "MultiWorkerMirroredStrategy(stall_warning_seconds=...)": (
        "stall_warning_seconds",
        _mwms_stall,
    ),
    "CommunicationOptions(timeout_seconds=...)": ("timeout_seconds", _timeout),
    "options.timeout_seconds = ...": ("timeout_seconds", _set_timeout),
}


# -- F1: NaN is refused where it is given, naming the option --------------------------


@pytest.mark.parametrize("nan", [math.nan, np.float64("nan"), np.float32("nan")], ids=repr)
@pytest.mark.parametrize("setter", list(SETTERS))
def test_nan_seconds_are_refused_naming_the_option(setter: str, nan: Any) -> None:
    option, make = SETTERS[setter]
    with pytest.raises(ValueError, match=rf"^{option} must be a") as caught:
        make(nan)
    message = str(caught.value)
    assert message.startswith(f"{option} must be a")
    assert f"got {nan!r}; pass an int or a float such as {option}=30.0, or None" in message


def test_stall_warning_seconds_zero_and_negative_are_refused() -> None:
    wanted = r"stall_warning_seconds must be a positive number of seconds \(math.inf: never\)"
    for value in (0, 0.0, -1, -math.inf, np.int64(0)):
        with pytest.raises(ValueError, match=wanted):
            _stall(value)


def test_timeout_seconds_negative_is_refused_and_zero_waits_for_ever() -> None:
    wanted = r"timeout_seconds must be a number of seconds >= 0 \(0 or math.inf: wait for ever\)"
    for value in (-1, -0.5, -math.inf, np.float32(-1), -(10**400)):
        with pytest.raises(ValueError, match=wanted):
            _timeout(value)
    assert _timeout(0).timeout_seconds == 0.0
    assert math.copysign(1.0, _timeout(-0.0).timeout_seconds or 0.0) == 1.0  # -0.0 as 0.0


@pytest.mark.anyio
async def test_a_waiting_collective_with_a_numpy_stall_warning_completes() -> None:
    s = _stall(np.float32(30.0))

    async def step() -> Any:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 1:
            for _ in range(3):
                await anyio.lowlevel.checkpoint()  # replica 0 waits for replica 1
        return await ctx.all_reduce("sum", 1.0)

    result = await s.run(step)
    assert s.experimental_local_results(result) == (2.0, 2.0)


# -- F3: one rule for every number of seconds ------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), REALS, ids=lambda v: repr(v)[:20])
@pytest.mark.parametrize("setter", [k for k in SETTERS if not k.startswith("MultiWorker")])
def test_every_real_number_of_seconds_is_accepted_as_a_float(
    setter: str, value: Any, seconds: float
) -> None:
    _, make = SETTERS[setter]
    made = make(value)
    stored = (
        made.timeout_seconds
        if isinstance(made, ar.CommunicationOptions)
        else made._stall_warning_seconds  # type: ignore[attr-defined]
    )
    assert type(stored) is float
    assert stored == seconds


@pytest.mark.parametrize("value", NOT_NUMBERS, ids=repr)
@pytest.mark.parametrize("setter", list(SETTERS))
def test_what_is_not_a_real_number_is_refused_naming_the_option(setter: str, value: Any) -> None:
    option, make = SETTERS[setter]
    with pytest.raises(TypeError, match=rf"^{option} must be a") as caught:
        make(value)
    message = str(caught.value)
    assert message.startswith(f"{option} must be a")
    assert f"got {value!r} ({type(value).__name__}); pass an int or a float" in message


def test_a_huge_value_is_shortened_in_the_message() -> None:
    with pytest.raises(ValueError, match=r"got -10000.*\.\.\..*0000; pass an int") as caught:
        _timeout(-(10**400))
    assert len(str(caught.value)) < 200


def test_a_refused_assignment_keeps_the_old_value() -> None:
    options = ar.CommunicationOptions(timeout_seconds=np.int64(2))
    refused: tuple[Any, ...] = (math.nan, -1, "2", True)
    for value in refused:
        with pytest.raises((TypeError, ValueError), match="timeout_seconds"):
            options.timeout_seconds = value
    assert options == ar.CommunicationOptions(timeout_seconds=2.0)


# -- F4: the summary's header counts the runs its body shows ---------------------------


def test_summary_counts_runs_whose_slices_max_events_dropped(tmp_path: Path) -> None:
    s = ar.MirroredStrategy(DEVICES)
    path = tmp_path / "dropped.json"

    async def exits() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        await ctx.all_reduce("sum", 1.0)
        if ctx.replica_id_in_sync_group == 1:
            return
        await ctx.all_reduce("sum", 1.0)

    async def main() -> None:
        for _ in range(3):
            with pytest.raises(ar.ReplicaExitedError):
                await s.run(exits)

    with s.trace(path, max_events=1):
        anyio.run(main)
    lines = summarize(path).splitlines()
    assert lines[0].endswith(": 2 replicas, 0 collectives in 3 runs")
    assert lines[1] == (
        "(the oldest 14 events of the 3 runs traced were dropped, 6 collectives among them: "
        "max_events=1; the counts above are of the events kept)"
    )
    failed = [line.split(":")[0] for line in lines if line.startswith("Run ")]
    assert failed == ["Run 0 failed", "Run 1 failed", "Run 2 failed"]


# -- Observation: two trace() blocks on one path at once --------------------------------


async def _two_collectives() -> None:
    ctx = ar.get_replica_context()
    assert ctx is not None
    await ctx.all_reduce("sum", 1.0)
    await ctx.all_reduce("sum", 1.0)


def test_a_path_traced_to_by_an_open_block_is_refused(tmp_path: Path) -> None:
    s = ar.MirroredStrategy(DEVICES)
    t = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    path = tmp_path / "one.json"
    wanted = (
        rf"^cannot trace to {re.escape(str(path))}: it is already being traced to by another "
        r"strategy.trace\(\) block that is still open; the trace written last would "
        r"overwrite the other without a word. Give each strategy.trace\(\) its own path.$"
    )
    with s.trace(path):
        with pytest.raises(ValueError, match=wanted), t.trace(path):
            pass
        with pytest.raises(ValueError, match=wanted), s.trace(str(path)):
            pass  # the same strategy too, and the path however it is spelled
        anyio.run(s.run, _two_collectives)
    assert "2 replicas, 2 collectives in 1 run" in summarize(path)  # s's trace, whole
    with t.trace(path):  # free again once the block has exited
        anyio.run(t.run, _two_collectives)
    assert "3 replicas, 2 collectives in 1 run" in summarize(path)


def test_a_path_traced_to_from_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncreplica._tracing import _session
    from asyncreplica._tracing._recorder import ChromeTracer

    path = tmp_path / "env.json"
    monkeypatch.setitem(_session._ENV_TRACERS, str(path), ChromeTracer())
    s = ar.MirroredStrategy(DEVICES)
    with (
        pytest.raises(ValueError, match=r"already being traced to by ASYNCREPLICA_TRACE"),
        s.trace(path),
    ):
        pass
    assert not path.exists()
