#!/usr/bin/env bash
# Device check of the cupy backend, for a machine with a CUDA GPU: one command, run as is.
#
#   scripts/gpu_check.sh
#
# 1. Installs the package with its GPU and test extras (pip install -e ".[gpu,test]": CuPy
#    with the CUDA toolkit wheels that its kernels need, trio for the anyio tests) into a
#    virtual environment, $GPU_CHECK_VENV (default ${TMPDIR:-/tmp}/asyncreplica-gpu-check,
#    reused when present).
#    The `cupy` and `numpy` backends register through entry points, so the package must be
#    installed, not only put on PYTHONPATH. GPU_CHECK_PYTHON=/path/to/python skips the
#    install and uses that interpreter as it is (it must have the package installed).
# 2. Runs every test of tests/backends/gpu (the `gpu`-marked ones need the GPU).
# 3. Runs scripts/gpu_bench.py: N replicas on GPU 0, 256 MiB float32 all_reduce against a
#    device-to-device copy, both timed with CUDA events (wall clock beside).
#
# scripts/gpu_precheck.sh checks, without a GPU, everything this script does first.
# Each step has a time limit: the install 20 minutes (a first download is ~3 GB), the tests
# 4 minutes, the benchmark 2 minutes. Exit status: 0 when the tests pass and the
# benchmark meets its target; 2 without a usable GPU; 3 when the install fails; otherwise
# the first failing step's status.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    PY="$GPU_CHECK_PYTHON"
    echo "== install: skipped (GPU_CHECK_PYTHON=$PY)"
else
    VENV="${GPU_CHECK_VENV:-${TMPDIR:-/tmp}/asyncreplica-gpu-check}"
    echo "== install: pip install -e \".[gpu,test]\" into $VENV"
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV" || { echo "gpu_check: could not create $VENV"; exit 3; }
    fi
    PY="$VENV/bin/python"
    if ! timeout 1200 "$PY" -m pip install -q --disable-pip-version-check -e ".[gpu,test]"; then
        echo "gpu_check: pip install -e \".[gpu,test]\" failed (see above); nothing was run"
        exit 3
    fi
fi

echo "== environment"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"
if ! timeout 120 "$PY" -c '
import importlib.metadata as md
import cupy, trio
from asyncreplica_cupy import CupyBackend, kernel_problem
assert "cupy" in {e.name for e in md.entry_points(group="asyncreplica.backends")}, "no entry point"
CupyBackend.check_available()
problem = kernel_problem()
assert problem is None, problem
print("CuPy", cupy.__version__, "| trio", trio.__version__, "| GPUs:",
      cupy.cuda.runtime.getDeviceCount(), "| kernels compile")
'; then
    echo "gpu_check: CuPy, a GPU, trio or the kernel compiler is missing (see above); nothing was run"
    exit 2
fi

echo "== tests (tests/backends/gpu)"
timeout 240 "$PY" -m pytest -p no:cacheprovider -q -ra tests/backends/gpu
tests_rc=$?

echo "== benchmark (scripts/gpu_bench.py)"
timeout 120 "$PY" scripts/gpu_bench.py --replicas 2,4,8 --mib 256
bench_rc=$?

echo "== summary"
echo "tests: exit ${tests_rc}; benchmark: exit ${bench_rc} (124 = timed out)"
if [ "$tests_rc" -ne 0 ]; then exit "$tests_rc"; fi
exit "$bench_rc"
