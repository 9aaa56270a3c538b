#!/usr/bin/env bash
# Everything scripts/gpu_check.sh does before it needs a GPU, checked on a machine without one.
#
#   scripts/gpu_precheck.sh
#
# 1. Installs the package with its GPU and test extras (pip install -e ".[gpu,test]":
#    cupy-cuda12x with its CUDA toolkit wheels, NVRTC and the headers) into a throwaway
#    virtual environment: $PRECHECK_VENV, default a new temporary folder, removed at the end
#    unless PRECHECK_KEEP=1. A first download is ~3 GB.
# 2. Checks what gpu_check.sh checks first: CuPy imports, the `cupy` and `numpy` backends
#    are registered through their entry points, trio is there.
# 3. Compiles with NVRTC, for sm_$PRECHECK_ARCH (default 90: H100/H200), every fold kernel
#    the backend can generate (all ops, arities, modes and dtypes), each as the backend
#    compiles it, with CuPy's own compiler options; and the spin kernels of the GPU tests
#    and of scripts/gpu_bench.py. Checks that an NVRTC compile in a worker thread lets the
#    main thread run (the backend compiles off the event loop), and that `asyncreplica
#    doctor` finds that kernels compile.
# 4. Collects the GPU test module (pytest --collect-only) and runs every test of
#    tests/backends/gpu that needs no GPU, with the real CuPy installed.
#
# Exit status: 0 when every step passes, else the first failing step's number.
set -uo pipefail
cd "$(dirname "$0")/.."
ARCH="${PRECHECK_ARCH:-90}"

if [ -n "${PRECHECK_VENV:-}" ]; then
    VENV="$PRECHECK_VENV"
else
    TMP="$(mktemp -d)"
    VENV="$TMP/venv"
    if [ "${PRECHECK_KEEP:-0}" != 1 ]; then trap 'rm -rf "$TMP"' EXIT; fi
fi

echo "== 1. install: pip install -e \".[gpu,test]\" into $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" || exit 1
fi
PY="$VENV/bin/python"
if ! timeout 1800 "$PY" -m pip install -q --disable-pip-version-check -e ".[gpu,test]"; then
    echo "gpu_precheck: pip install failed"
    exit 1
fi
"$PY" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE "^(cupy-|nvidia-cuda|cuda-|trio |numpy )"

echo "== 2. environment (what gpu_check.sh checks first, less the GPU)"
if ! timeout 120 "$PY" - <<'EOF'
import importlib.metadata as md
import sys

import cupy
import trio

names = {e.name: e.value for e in md.entry_points(group="asyncreplica.backends")}
assert names.get("cupy") == "asyncreplica_cupy:CupyBackend", names
assert names.get("numpy") == "asyncreplica_numpy:NumpyBackend", names
from asyncreplica_cupy import CupyBackend, visible_gpu_count

print(f"CuPy {cupy.__version__}; trio {trio.__version__}; entry points: {sorted(names)}")
print(f"GPUs CuPy sees: {visible_gpu_count()} (none expected here)")
try:
    CupyBackend.check_available()
except Exception as exc:
    print(f"check_available (no GPU): {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
sys.exit(0)
EOF
then
    echo "gpu_precheck: step 2 failed"
    exit 2
fi

echo "== 3. compile every kernel variant with NVRTC for sm_${ARCH}"
if ! timeout 1200 "$PY" - "$ARCH" <<'EOF'
import collections
import pathlib
import re
import sys
import threading
import time

from asyncreplica_cupy import compile_offline, every_fold_variant, kernel_problem
from cupy._core import core
from cupy.cuda import compiler

arch = sys.argv[1]
variants = every_fold_variant()
start = time.perf_counter()
done = compile_offline(variants, arch=arch)
elapsed = time.perf_counter() - start
by_mode = collections.Counter(v.mode.value for v in variants)
by_dtype = collections.Counter(v.dtype for v in variants)
print(f"fold kernels compiled: {done} of {len(variants)} in {elapsed:.1f} s "
      f"({elapsed / max(done, 1) * 1e3:.0f} ms each)")
print(f"  by mode: {dict(by_mode)}")
print(f"  ops: {sorted({v.op.value for v in variants})}; arities: 1..{max(v.arity for v in variants)}")
print(f"  dtypes ({len(by_dtype)}): {', '.join(by_dtype)}")
assert done == len(variants)


def nvrtc(code: str, name: str) -> None:
    options = core.assemble_cupy_compiler_options(())
    options += ("-ftz=true", f"-arch=sm_{arch}", "--device-as-default-execution-space")
    compiler._NVRTCProgram(code, name, method="cubin").compile(options)


# The spin kernels of the GPU tests and of the benchmark (RawKernel sources).
spins = 0
for path in ("tests/backends/gpu/test_cupy_gpu.py", "scripts/gpu_bench.py"):
    text = pathlib.Path(path).read_text()
    for source in re.findall(r'_SPIN = r"""(.*?)"""', text, re.S):
        nvrtc(source, "spin.cu")
        spins += 1
assert spins == 2, spins
print(f"spin kernels of the tests and the benchmark compiled: {spins}")

# NVRTC releases the GIL: a compile in a worker thread lets this thread run.
from asyncreplica_cupy._plan import fold_kernel_source

big = "\n".join(
    fold_kernel_source(v.op, v.arity, v.mode, v.dtype).code
    for v in variants
    if v.arity == max(u.arity for u in variants) and v.dtype in ("float16", "float32")
)
ticks = 0
worker = threading.Thread(target=nvrtc, args=(big, "many.cu"))
t0 = time.perf_counter()
worker.start()
while worker.is_alive():
    ticks += 1
    time.sleep(0.001)
compile_seconds = time.perf_counter() - t0
print(f"compile in a worker thread: {compile_seconds:.2f} s; main thread ran {ticks} times meanwhile")
assert ticks >= max(3, int(compile_seconds * 1000) // 10), "the compile held the GIL"

problem = kernel_problem()
assert problem is None, problem
print("kernel_problem(): None (kernels compile here)")
EOF
then
    echo "gpu_precheck: step 3 failed"
    exit 3
fi
doctor="$(timeout 120 "$VENV/bin/asyncreplica" doctor 2>&1)"
echo "asyncreplica doctor, the cupy backend's lines:"
grep -A1 "^  cupy:" <<<"$doctor" | cut -c1-150
if ! grep -q "^    kernels: compile" <<<"$doctor"; then
    echo "gpu_precheck: asyncreplica doctor does not say that kernels compile"
    exit 3
fi

echo "== 4. tests: collect the GPU module, run what needs no GPU"
if ! timeout 300 "$PY" -m pytest -p no:cacheprovider -q --collect-only tests/backends/gpu/test_cupy_gpu.py | tail -3; then
    echo "gpu_precheck: collecting tests/backends/gpu/test_cupy_gpu.py failed"
    exit 4
fi
if ! timeout 600 "$PY" -m pytest -p no:cacheprovider -q -rs tests/backends/gpu 2>&1 | tail -15; then
    echo "gpu_precheck: tests/backends/gpu failed"
    exit 4
fi
echo "== gpu_precheck: all steps passed"
