"""Arrays of other libraries in the cupy backend: which leaves are foreign, results back.

A leaf that is neither a CuPy nor a numpy array nor a Python number, but an array of a
library that implements the array API standard or DLPack, is *foreign*:

* a CUDA array (PyTorch on CUDA, JAX on GPU) is read in place through DLPack (or
  ``__cuda_array_interface__``), and each replica gets its result back through its
  library's ``from_dlpack``: zero-copy, on the replica's GPU, as a tensor of its own type;
* a host array (JAX on the CPU, ``array_api_strict``, PyTorch on the CPU) is held as a
  numpy array (``asyncreplica_numpy``'s ``to_host``: zero-copy), copied to the GPU like
  any numpy value, and its result comes back to the host once per distinct result
  buffer, then in the input's type and on its device (``from_host_shared``).

An array on a device neither CUDA nor the CPU (ROCm, Metal, ...) is a ``BackendError``
that says so (:func:`asyncreplica_numpy._devices.unserved_device_error`).

Nothing here imports CuPy: the functions that touch result arrays take the ``cupy``
module as an argument, so the routing is tested with stand-ins on any machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from asyncreplica_numpy.interop import (
    Library,
    from_host_shared,
    library_of,
    place_like,
    several_devices,
    takes_ownership,
    to_host,
    unserved_device_error,
)

from asyncreplica import BackendError

__all__ = ["CUDA_DLPACK", "HOST_DLPACK", "Foreign", "foreign_of", "from_gpu", "restore"]

#: DLPack device types whose memory a CUDA kernel can read: kDLCUDA, kDLCUDAManaged.
CUDA_DLPACK = (2, 13)
#: DLPack device types the CPU reads: kDLCPU, kDLCUDAHost (pinned).
HOST_DLPACK = (1, 3)


class Foreign(NamedTuple):
    """How the cupy backend holds a leaf of another array library.

    Attributes:
        library: The leaf's array type and namespace.
        on_gpu: True for a CUDA array (read in place, results through DLPack); False
            for a host array (held as numpy, copied to the GPU, results copied back).
    """

    library: Library
    on_gpu: bool


def _is_cupy_array(value: object) -> bool:
    cupy = sys.modules.get("cupy")  # a cupy array exists only once cupy is imported
    return cupy is not None and isinstance(value, cupy.ndarray)


def _dlpack_device_type(value: object) -> int | None:
    """``value.__dlpack_device__()[0]``, or None without one (or when it fails)."""
    method = getattr(value, "__dlpack_device__", None)
    if method is None:
        return None
    try:
        return int(method()[0])
    except Exception:  # a producer that cannot say: treated as having no DLPack device
        return None


def foreign_of(value: object) -> Foreign | None:
    """Whether (and how) ``value`` is a foreign leaf; None for CuPy, numpy and numbers.

    Raises:
        BackendError: ``value`` lives on a device neither CUDA nor the CPU (ROCm,
            Metal, ...): no backend serves it.
    """
    if type(value) is np.ndarray or _is_cupy_array(value):
        return None
    library = library_of(value)
    if library is None or library.name == "cupy.ndarray":
        return None
    kind = _dlpack_device_type(value)
    if kind is None:
        return Foreign(library, hasattr(value, "__cuda_array_interface__"))
    if kind in CUDA_DLPACK:
        return Foreign(library, True)
    if kind in HOST_DLPACK:
        return Foreign(library, False)
    raise unserved_device_error(value, library.name, kind, "cupy")


def host_leaf(value: object, foreign: Foreign) -> object:
    """A host foreign leaf as a numpy array (zero-copy); a CUDA one as it is."""
    return value if foreign.on_gpu else to_host(value, foreign.library)


def _from_gpu_column(cupy: Any, column: Sequence[Any], library: Library) -> list[object]:
    """Each replica's CuPy result as an array of ``library`` (see :func:`from_gpu`).

    Replicas on one GPU may get views of one result buffer. An immutable library (JAX)
    shares it; any other (PyTorch) has writable tensors, so each replica after the
    first on a buffer gets its own device copy: writing into one replica's result
    never changes another's.
    """
    seen: set[int] = set()
    out = []
    for a in column:
        ptr = int(a.data.ptr)
        if ptr in seen and not takes_ownership(library):
            with cupy.cuda.Device(int(a.device.id)):
                a = a.copy()
        seen.add(ptr)
        out.append(from_gpu(cupy, a, library))
    return out


def from_gpu(cupy: Any, array: Any, library: Library) -> object:
    """A CuPy result as an array of ``library`` on the same GPU, zero-copy through DLPack.

    A library that refuses the buffer (JAX imports only aligned GPU buffers; a chunk of
    ``reduce_scatter`` may start anywhere) gets a fresh contiguous copy of it instead.

    Raises:
        BackendError: The library cannot import a CUDA buffer through DLPack at all.
    """
    convert = library.namespace.from_dlpack
    try:
        return convert(array)
    except (BufferError, TypeError, RuntimeError, ValueError):
        pass
    with cupy.cuda.Device(int(array.device.id)):
        fresh = array.copy()  # C-contiguous, at the start of a new (aligned) allocation
    try:
        return convert(fresh)
    except (BufferError, TypeError, RuntimeError, ValueError) as exc:
        raise BackendError(
            f"the cupy backend's result could not be given back as a {library.name}: its "
            f"from_dlpack refused a CUDA buffer ({type(exc).__name__}: {exc}). Pass CuPy "
            "arrays (cupy.from_dlpack(x) is zero-copy) and convert the results yourself"
        ) from exc


def _to_host_once(
    cupy: Any, arrays: Sequence[Any], stream_of: Callable[[int], Any] | None
) -> list[object]:
    """Each CuPy array on the host: one device-to-host copy per distinct buffer.

    Replicas on one GPU get views of one result buffer; they share one host copy,
    read-only (``from_host_shared`` gives each its own array of it). Each copy runs on
    ``stream_of(gpu)`` (the backend's stream, whose work is done by now), so it waits
    for the copy only, never for work the user queued on their own stream.
    """
    copies: dict[tuple[int, tuple[int, ...], tuple[int, ...], str], object] = {}
    out = []
    for a in arrays:
        key = (int(a.data.ptr), tuple(a.shape), tuple(a.strides), a.dtype.str)
        host = copies.get(key)
        if host is None:
            gpu = int(a.device.id)
            with cupy.cuda.Device(gpu):
                array = cupy.asnumpy(a, stream=None if stream_of is None else stream_of(gpu))
            array.flags.writeable = False
            host = copies[key] = array
        out.append(host)
    return out


def restore(
    cupy: Any,
    results: list[list[object]],
    kinds: Sequence[Foreign | None],
    inputs: Sequence[Sequence[object]],
    *,
    place_gpu: bool = True,
    stream_of: Callable[[int], Any] | None = None,
) -> list[list[object]]:
    """Each replica's CuPy results in the array type and on the device of its input.

    Args:
        cupy: The ``cupy`` module.
        results: ``results[r][j]``: replica ``r``'s CuPy result of leaf ``j``.
        kinds: Each leaf's :class:`Foreign` (from replica 0's leaves), None for leaves
            that stay CuPy arrays.
        inputs: ``inputs[r][j]``: the leaf whose type and device replica ``r`` gets.
        place_gpu: Whether a CUDA result moves to its input's GPU when that differs
            from the replica's (not for ``broadcast``: each replica's GPU is the point).
        stream_of: The stream of each GPU that host copies run on (None: the current).

    Returns:
        New rows; leaves whose kind is None are the CuPy results as they are.
    """
    out = [list(row) for row in results]
    for j, kind in enumerate(kinds):
        if kind is None:
            continue
        column = [row[j] for row in results]
        wanted = [row[j] for row in inputs]
        if kind.on_gpu:
            converted = _from_gpu_column(cupy, column, kind.library)
            if place_gpu and several_devices(kind.library, host=False):
                converted = place_like(converted, wanted)
        else:
            shared = from_host_shared(_to_host_once(cupy, column, stream_of), kind.library)
            converted = shared
            if several_devices(kind.library, host=True):
                converted = place_like(shared, wanted, one_device=True)
        for row, value in zip(out, converted, strict=True):
            row[j] = value
    return out
