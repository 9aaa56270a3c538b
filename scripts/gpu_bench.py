"""Benchmark: the cupy backend's all_reduce of N replicas on one GPU against a plain copy.

For each N it times ``CupyBackend(["GPU:0"] * N).all_reduce(SUM, ...)`` of one float32
array per replica (``--mib`` MiB each), as a caller sees it (the await, polling
included), and, in the same run, a device-to-device copy of the same bytes.

Bandwidth counts the bytes each operation must move through GPU memory:

* copy: 1 read + 1 write of the array  -> 2 x size;
* all_reduce of N replicas: N inputs read + 1 output written -> (N + 1) x size.

The target (issue #7) is an all_reduce bandwidth of at least 70% of the copy's. The
script prints a table and exits 1 when a row misses the target, 2 without a GPU.

Usage: ``PYTHONPATH=.:backends python3 scripts/gpu_bench.py [--replicas 2,4,8] [--mib 256]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

TARGET = 0.70


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", default="2,4,8", help="replica counts (default 2,4,8)")
    parser.add_argument("--mib", type=int, default=256, help="MiB per replica (default 256)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls (default 10)")
    return parser.parse_args()


def _copy_seconds(cp: Any, nbytes: int, repeats: int) -> float:
    """Median seconds of one device-to-device copy of ``nbytes``, timed with CUDA events."""
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    stream = cp.cuda.Stream(non_blocking=True)
    times = []
    for i in range(repeats + 2):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        dst.data.copy_from_device_async(src.data, nbytes, stream)
        stop.record(stream)
        stop.synchronize()
        if i >= 2:  # warm-up
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1000.0)
    return float(statistics.median(times))


def _all_reduce_seconds(cp: Any, replicas: int, nbytes: int, repeats: int) -> tuple[float, bool]:
    """Median wall seconds of one awaited all_reduce, and whether its result was right."""
    import anyio
    from asyncreplica_cupy import CupyBackend

    from asyncreplica import ReduceOp

    backend = CupyBackend(["GPU:0"] * replicas)
    count = nbytes // 4
    values = [[cp.full(count, r + 1, cp.float32)] for r in range(replicas)]
    cp.cuda.Device(0).synchronize()
    times: list[float] = []
    correct = True

    async def main() -> None:
        nonlocal correct
        for i in range(repeats + 2):
            t0 = time.perf_counter()
            results = await backend.all_reduce(ReduceOp.SUM, values)
            elapsed = time.perf_counter() - t0
            if i >= 2:  # the first call compiles the kernel
                times.append(elapsed)
            if i == 0:
                expected = replicas * (replicas + 1) / 2
                head = cp.asnumpy(results[-1][0])[:1024]
                correct = bool((head == expected).all())
            del results

    anyio.run(main)
    anyio.run(backend.aclose)
    return statistics.median(times), correct


def main() -> int:
    """Run the benchmark and print the table; the exit status says whether it met the target."""
    args = _parse()
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
    _say("1 output written ((N + 1) x size); all_reduce time = the awaited call, wall clock")
    copy = _copy_seconds(cp, nbytes, args.repeats)
    copy_bw = 2 * nbytes / copy
    header = f"{'operation':<22}{'time ms':>10}{'moved MiB':>12}{'GB/s':>10}{'vs copy':>10}  result"
    _say(header)
    _say("-" * len(header))
    _say(f"{'d2d copy':<22}{copy * 1e3:>10.3f}{2 * args.mib:>12}{copy_bw / 1e9:>10.1f}{1:>10.0%}")
    ok = True
    for n in counts:
        seconds, correct = _all_reduce_seconds(cp, n, nbytes, args.repeats)
        bw = (n + 1) * nbytes / seconds
        ratio = bw / copy_bw
        verdict = ("ok" if ratio >= TARGET else f"BELOW {TARGET:.0%}") + (
            "" if correct else ", WRONG RESULT"
        )
        ok = ok and ratio >= TARGET and correct
        label = f"all_reduce N={n}"
        _say(
            f"{label:<22}{seconds * 1e3:>10.3f}{(n + 1) * args.mib:>12}"
            f"{bw / 1e9:>10.1f}{ratio:>10.0%}  {verdict}"
        )
    _say(f"target: all_reduce >= {TARGET:.0%} of the copy bandwidth: {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
