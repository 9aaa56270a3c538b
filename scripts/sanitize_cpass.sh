#!/usr/bin/env bash
# The numpy backend's C pass (backends/asyncreplica_numpy/_cpass.c) built with AddressSanitizer
# and UndefinedBehaviorSanitizer, and its tests run against that build: the differential tests
# of the C and Python passes (tests/backends/test_batch_pass.py) and the hostile direct calls
# (tests/backends/test_cpass_hostile.py). An invalid read or write, a use after free, an
# overflowing offset or a NULL pointer passed to memcmp stops the run with a report, even where
# the normal build happens to survive it. Called by .ci/run; about 30 s on 2 cores.
#
# The package is copied next to the sanitized extension into a temporary folder that comes
# first on the path, so that `asyncreplica_numpy._cpass` is that build (checked before the
# tests run). Python itself is not instrumented: libasan is preloaded, leaks are not reported
# (the interpreter keeps memory until exit), and PYTHONMALLOC=malloc lets ASan see every
# object's memory; pytest captures only Python's own output (--capture=sys), so that a
# sanitizer's report, written to file descriptor 2 as the process stops, is seen. Needs gcc
# (or CC) with libasan and libubsan, the Python headers, and numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
cc=${CC:-gcc}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
package=$tmp/asyncreplica_numpy
mkdir "$package"
cp backends/asyncreplica_numpy/*.py backends/asyncreplica_numpy/_cpass.c \
    backends/asyncreplica_numpy/_cpass.pyi "$package"/

include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
numpy_include=$("$python" -c 'import numpy; print(numpy.get_include())')
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
"$cc" -shared -fPIC -g -O1 -fno-omit-frame-pointer \
    -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -Wno-missing-field-initializers \
    -I"$include" -I"$numpy_include" \
    backends/asyncreplica_numpy/_cpass.c -o "$package/_cpass$suffix"

export LD_PRELOAD
LD_PRELOAD=$("$cc" -print-file-name=libasan.so)
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONMALLOC=malloc
export PYTHONPATH=$tmp:$root:$root/backends${PYTHONPATH:+:$PYTHONPATH}

"$python" - "$package" <<'EOF'
import sys

import asyncreplica_numpy._cpass as cpass

if not cpass.__file__.startswith(sys.argv[1]):
    sys.exit(f"sanitize_cpass: imported {cpass.__file__}, not the sanitized build")
EOF
"$python" -m pytest -q -p no:cacheprovider --capture=sys \
    tests/backends/test_batch_pass.py tests/backends/test_cpass_hostile.py
