#!/usr/bin/env bash
# Device check of the cupy backend (issue #7), for a machine with a CUDA GPU and CuPy.
#
# Installs nothing: the repository is used in place (PYTHONPATH=.:backends). Runs the
# tests of tests/backends/gpu (the `gpu`-marked ones need the GPU; the others run
# anywhere) and scripts/gpu_bench.py (N replicas on GPU 0, 256 MiB float32 all_reduce
# against a device-to-device copy of the same bytes). Each step has a time limit; the
# whole script stays under 5 minutes. Exit status: 0 when the tests pass and the
# benchmark meets its target, else the first failing step's status.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/backends${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"

echo "== environment"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"
if ! timeout 60 "$PY" -c '
import cupy
from asyncreplica_cupy import CupyBackend
CupyBackend.check_available()
print("CuPy", cupy.__version__, "| GPUs:", cupy.cuda.runtime.getDeviceCount())
'; then
    echo "gpu_check: CuPy or a GPU is missing (see above); nothing was run"
    exit 2
fi

echo "== tests (tests/backends/gpu)"
# addopts is cleared so that a machine without pytest-timeout still runs them.
timeout 180 "$PY" -m pytest -o addopts="" -p no:cacheprovider -q -ra tests/backends/gpu
tests_rc=$?

echo "== benchmark (scripts/gpu_bench.py)"
timeout 90 "$PY" scripts/gpu_bench.py --replicas 2,4,8 --mib 256
bench_rc=$?

echo "== summary"
echo "tests: exit ${tests_rc}; benchmark: exit ${bench_rc} (124 = timed out)"
if [ "$tests_rc" -ne 0 ]; then exit "$tests_rc"; fi
exit "$bench_rc"
