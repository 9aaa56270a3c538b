"""Benchmark: the cupy backend's all_reduce of N replicas on one GPU against a plain copy.

For each N it times ``CupyBackend(["GPU:0"] * N).all_reduce(SUM, ...)`` of one float32
array per replica (``--mib`` MiB each) and, in the same run, a device-to-device copy of
the same bytes. Both are timed the same two ways:

* device time, with CUDA events on the stream that does the work. A short spin kernel
  holds that stream first, so every operation of the call is queued before the start
  event runs: the time is the GPU's work only, not Python's launch overhead. For the
  all_reduce, the stop event is recorded on the backend's stream the moment the call has
  queued its work (a wrapper around the backend's ``wait_for_events``);
* wall clock, as a caller sees the awaited call (launch, the wait's polling, wake-up).

Bandwidth counts the bytes each operation must move through GPU memory:

* copy: 1 read + 1 write of the array  -> 2 x size;
* all_reduce of N replicas: N inputs read + 1 output written -> (N + 1) x size.

The target (issue #7) is an all_reduce *device* bandwidth of at least 70% of the copy's;
the wall-clock figure is printed beside it. The script prints a table and exits 1 when a
row misses the target or gives a wrong result, 2 without a GPU.

Usage: ``python3 scripts/gpu_bench.py [--replicas 2,4,8] [--mib 256]`` (after
``pip install -e ".[gpu]"``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

TARGET = 0.70
GATE_SECONDS = 0.005  # the spin that holds a stream while a call queues its work

_SPIN = r"""
extern "C" __global__ void gate_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", default="2,4,8", help="replica counts (default 2,4,8)")
    parser.add_argument("--mib", type=int, default=256, help="MiB per replica (default 256)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls (default 10)")
    return parser.parse_args()


class _Gate:
    """A spin kernel that holds a stream for about ``GATE_SECONDS``."""

    def __init__(self, cp: Any) -> None:
        self.kernel = cp.RawKernel(_SPIN, "gate_spin")
        rate_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
        self.cycles = int(rate_khz * 1000 * GATE_SECONDS)

    def hold(self, cp: Any, stream: Any) -> None:
        import numpy as np

        with stream:
            self.kernel((1,), (1,), (np.int64(self.cycles),))


def _copy_seconds(cp: Any, gate: _Gate, nbytes: int, repeats: int) -> tuple[float, float]:
    """Median device and wall seconds of one device-to-device copy of ``nbytes``."""
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    stream = cp.cuda.Stream(non_blocking=True)
    device: list[float] = []
    wall: list[float] = []
    for i in range(repeats + 2):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        gate.hold(cp, stream)
        start.record(stream)
        dst.data.copy_from_device_async(src.data, nbytes, stream)
        stop.record(stream)
        stop.synchronize()
        t0 = time.perf_counter()  # wall clock: an ungated copy, waited for
        dst.data.copy_from_device_async(src.data, nbytes, stream)
        stream.synchronize()
        elapsed = time.perf_counter() - t0
        if i >= 2:  # warm-up
            device.append(cp.cuda.get_elapsed_time(start, stop) / 1000.0)
            wall.append(elapsed)
    return float(statistics.median(device)), float(statistics.median(wall))


def _all_reduce_seconds(
    cp: Any, gate: _Gate, replicas: int, nbytes: int, repeats: int
) -> tuple[float, float, bool]:
    """Median device and wall seconds of one awaited all_reduce, and whether it was right."""
    import anyio
    from asyncreplica_cupy import CupyBackend
    from asyncreplica_cupy import _backend as backend_module

    from asyncreplica import ReduceOp

    backend = CupyBackend(["GPU:0"] * replicas)
    stream = backend._stream(cp, 0)
    count = nbytes // 4
    values = [[cp.full(count, r + 1, cp.float32)] for r in range(replicas)]
    cp.cuda.Device(0).synchronize()
    device: list[float] = []
    wall: list[float] = []
    correct = True
    original = backend_module.wait_for_events
    stops: list[Any] = []

    async def timed_wait(events: Sequence[Any], **kwargs: Any) -> None:
        # Runs once the collective has queued all its work: stop goes right behind it.
        if stops:
            with cp.cuda.Device(0):
                stops[-1].record(stream)
        await original(events, **kwargs)

    async def call() -> list[list[object]]:
        return await backend.all_reduce(ReduceOp.SUM, values)

    async def main() -> None:
        nonlocal correct
        for i in range(repeats + 2):
            # Device time: the stream is held while the call queues its work.
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            stops.append(stop)
            gate.hold(cp, stream)
            with cp.cuda.Device(0):
                start.record(stream)
            backend_module.wait_for_events = timed_wait
            try:
                results = await call()
            finally:
                backend_module.wait_for_events = original
                stops.clear()
            if i == 0:
                expected = replicas * (replicas + 1) / 2
                head = cp.asnumpy(results[-1][0])[:1024]
                correct = bool((head == expected).all())
            del results
            # Wall clock: the same call, ungated, as a caller sees it.
            t0 = time.perf_counter()
            results = await call()
            elapsed = time.perf_counter() - t0
            del results
            if i >= 2:  # the first calls compile and allocate
                device.append(cp.cuda.get_elapsed_time(start, stop) / 1000.0)
                wall.append(elapsed)

    anyio.run(main)
    anyio.run(backend.aclose)
    return float(statistics.median(device)), float(statistics.median(wall)), correct


def _row(label: str, seconds: float, moved: int, nbytes_moved: int, base: float) -> str:
    bw = nbytes_moved / seconds
    return f"{label:<22}{seconds * 1e3:>9.3f}{moved:>11}{bw / 1e9:>9.1f}{bw / base:>9.0%}"


def main(argv: Callable[[], argparse.Namespace] = _parse) -> int:
    """Run the benchmark and print the table; the exit status says whether it met the target."""
    args = argv()
    try:
        import cupy as cp

        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        _say(f"gpu_bench: no GPU to benchmark ({type(exc).__name__}: {exc})")
        return 2
    if count < 1:
        _say("gpu_bench: CUDA shows no GPU")
        return 2
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    nbytes = args.mib << 20
    counts = [int(c) for c in args.replicas.split(",")]
    _say(f"GPU 0: {name}; CuPy {cp.__version__}; {args.mib} MiB float32 per replica")
    _say("bytes moved: copy = read + write (2 x size); all_reduce of N = N inputs read +")
    _say("1 output written ((N + 1) x size). device = CUDA events around the GPU work;")
    _say("wall = the awaited call as a caller sees it. The target is on device time.")
    gate = _Gate(cp)
    copy_dev, copy_wall = _copy_seconds(cp, gate, nbytes, args.repeats)
    copy_bw_dev = 2 * nbytes / copy_dev
    copy_bw_wall = 2 * nbytes / copy_wall
    header = (
        f"{'operation':<22}{'dev ms':>9}{'moved MiB':>11}{'GB/s':>9}{'vs copy':>9}"
        f"  |{'wall ms':>9}{'GB/s':>9}{'vs copy':>9}  result"
    )
    _say(header)
    _say("-" * len(header))
    _say(
        _row("d2d copy", copy_dev, 2 * args.mib, 2 * nbytes, copy_bw_dev)
        + "  |"
        + f"{copy_wall * 1e3:>9.3f}{copy_bw_wall / 1e9:>9.1f}{1:>9.0%}"
    )
    ok = True
    for n in counts:
        dev, wall, correct = _all_reduce_seconds(cp, gate, n, nbytes, args.repeats)
        moved = (n + 1) * nbytes
        ratio = moved / dev / copy_bw_dev
        verdict = ("ok" if ratio >= TARGET else f"BELOW {TARGET:.0%}") + (
            "" if correct else ", WRONG RESULT"
        )
        ok = ok and ratio >= TARGET and correct
        _say(
            _row(f"all_reduce N={n}", dev, (n + 1) * args.mib, moved, copy_bw_dev)
            + "  |"
            + f"{wall * 1e3:>9.3f}{moved / wall / 1e9:>9.1f}{moved / wall / copy_bw_wall:>9.0%}"
            + f"  {verdict}"
        )
    _say(
        f"target: all_reduce device bandwidth >= {TARGET:.0%} of the copy's: "
        f"{'MET' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
