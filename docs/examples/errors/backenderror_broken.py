"""A backend that is installed but cannot run here: BackendError.

A GPU backend on a machine without a GPU is the usual case. This example registers a
stand-in backend whose availability check fails the same way.
"""

from asyncreplica_numpy import NumpyBackend

import asyncreplica as ar
from asyncreplica.abc import register_backend


class NoDeviceBackend(NumpyBackend):
    name = "nodevice"

    @classmethod
    def check_available(cls):
        raise ar.BackendError("backend 'nodevice' found no device: no driver is loaded")


register_backend("nodevice", NoDeviceBackend)

try:
    ar.MirroredStrategy(["CPU:0", "CPU:1"], backend="nodevice")  # BUG: nothing to run on
except ar.BackendError as exc:
    error = exc
else:
    raise SystemExit("expected BackendError")

print(error)
assert type(error) is ar.BackendError
assert isinstance(error, RuntimeError)
