"""Arrays of other libraries on the CPU: JAX, array_api_strict, PyTorch, ...

A leaf that is not a numpy array, a numpy scalar or a Python number, but implements the
Python array API standard or DLPack, is a *foreign* leaf. The numpy backend holds it
as a numpy array (``np.from_dlpack``: zero-copy) and gives each replica its results
back in its own input's array type (the library's ``from_dlpack``, found through
``array-api-compat``; a copy through ``asarray`` where the library cannot import a
read-only numpy buffer).

``array_api_compat`` is imported on the first foreign leaf only: numpy inputs never
reach this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from asyncreplica import IndexedSlices

__all__ = ["Library", "from_host", "from_host_shared", "library_of", "to_host"]

Array = npt.NDArray[Any]

# DLPack device types (dlpack.h): memory the CPU can read directly.
_DL_CPU = 1
_DL_CUDA_HOST = 3  # pinned host memory
_DL_CUDA_MANAGED = 13
_HOST_DEVICES = frozenset((_DL_CPU, _DL_CUDA_HOST, _DL_CUDA_MANAGED))


class Library(NamedTuple):
    """How to hold one array type on the host and give results back in it.

    Attributes:
        name: The array type as users know it: ``"jax.Array"``, ``"torch.Tensor"``,
            ``"array_api_strict.Array"``.
        namespace: The array's namespace, as ``array_api_compat.array_namespace`` finds it.
    """

    name: str
    namespace: Any


# Per type: its Library, or None for a type that is not a foreign array.
_LIBRARIES: dict[type, Library | None] = {}
# Array types whose from_dlpack refuses the backend's read-only results: copied out.
# PyTorch has no read-only tensors: its from_dlpack (and asarray) would import the shared
# read-only result as a writable tensor on the same buffer, so torch is copied from the start.
_COPY_OUT: set[str] = {"torch.Tensor"}
# Immutable array types: replicas may share one buffer that only the library can reach.
_IMMUTABLE = frozenset(("jax.Array",))
# JAX imports a host buffer through DLPack without a copy only when it is so aligned.
_ALIGN = 64


def _type_name(value: object) -> str:
    import array_api_compat as compat

    if compat.is_jax_array(value):
        return "jax.Array"
    if compat.is_torch_array(value):
        return "torch.Tensor"
    if compat.is_cupy_array(value):
        return "cupy.ndarray"
    if compat.is_array_api_strict_namespace(compat.array_namespace(value)):
        return "array_api_strict.Array"
    kind = type(value)
    return f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"


def library_of(value: object) -> Library | None:
    """The :class:`Library` of a foreign array, or None for anything else.

    Numpy arrays (and subclasses), numpy scalars, Python numbers and ``IndexedSlices``
    are not foreign. The answer is cached per type.
    """
    kind = type(value)
    try:
        return _LIBRARIES[kind]
    except KeyError:
        pass
    library = None
    if not isinstance(value, np.ndarray | np.generic | int | float | complex | IndexedSlices) and (
        hasattr(kind, "__dlpack__") or hasattr(kind, "__array_namespace__")
    ):
        import array_api_compat as compat

        if compat.is_array_api_obj(value) and not compat.is_numpy_array(value):
            library = Library(_type_name(value), compat.array_namespace(value))
    if len(_LIBRARIES) > 256:
        _LIBRARIES.clear()
    _LIBRARIES[kind] = library
    return library


def to_host(value: object, library: Library) -> Array:
    """``value`` as a numpy array, zero-copy through DLPack where the library allows it.

    Raises:
        BackendError: ``value`` lives on a device the CPU cannot read (a GPU).
        TypeError: A torch tensor that requires grad, whose dtype numpy has not
            (``bfloat16``) or that torch cannot export (a conjugate view).
    """
    if library.name == "array_api_strict.Array":
        # array_api_strict wraps a numpy array in ``_array`` (private, but stable since
        # its first release); its ``__dlpack__`` compares versions on every call, which
        # costs more than the rest of a collective's routing. Guarded: DLPack otherwise.
        array = getattr(value, "_array", None)
        if type(array) is np.ndarray:
            return array
    dlpack_device = getattr(value, "__dlpack_device__", None)
    if dlpack_device is not None:
        device_type = int(dlpack_device()[0])
        if device_type not in _HOST_DEVICES:
            from ._devices import unserved_device_error

            raise unserved_device_error(value, library.name, device_type, "numpy")
        if library.name == "torch.Tensor" and getattr(value, "requires_grad", False):
            raise TypeError(
                "the tensor requires grad, and collectives are not differentiable: pass "
                "x.detach() (its result carries no autograd history either)"
            )
        try:
            return np.from_dlpack(value)  # type: ignore[arg-type]
        except (BufferError, TypeError, RuntimeError):
            pass  # e.g. a dtype DLPack cannot carry: numpy's conversion below copies
    if library.name != "torch.Tensor":
        return np.asarray(value)
    try:
        return np.asarray(value)
    except TypeError as exc:
        dtype = getattr(value, "dtype", None)
        try:  # does numpy have the dtype (not torch.bfloat16, float8_*, complex32)?
            np.asarray(library.namespace.empty(0, dtype=dtype))
        except TypeError:
            raise TypeError(
                f"its dtype {dtype} has no numpy equivalent ({exc}): cast it first, e.g. x.float()"
            ) from exc
        raise
    except RuntimeError as exc:  # e.g. a conjugate view: torch's message says what to do
        raise TypeError(str(exc)) from exc


def from_host(array: object, library: Library) -> object:
    """``array`` (a numpy array) in ``library``'s array type: a replica's own input's.

    Zero-copy through the library's ``from_dlpack`` where it accepts the (read-only)
    numpy buffer; otherwise a copy through its ``asarray``.
    """
    xp = library.namespace
    if library.name not in _COPY_OUT:
        convert: Callable[..., object] | None = getattr(xp, "from_dlpack", None)
        if convert is not None:
            try:
                return convert(array)
            except (BufferError, TypeError, RuntimeError, ValueError):
                # A read-only buffer the library cannot import (JAX, PyTorch): copy it,
                # and from now on without trying (a failed import costs a third of a copy).
                pass
        _COPY_OUT.add(library.name)
    if library.name in _IMMUTABLE:
        return xp.asarray(array)
    # A mutable library's array must not share the backend's read-only buffer: it gets a
    # writable copy (torch.asarray imports that copy without another).
    return xp.asarray(np.array(array))


def _aligned_copy(array: Array) -> Array:
    """A writable, C-contiguous copy of ``array`` whose data is ``_ALIGN``-byte aligned."""
    raw = np.empty(array.nbytes + _ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    copy = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(copy, array)
    return copy


def from_host_shared(arrays: list[object], library: Library) -> list[object]:
    """Each replica's numpy result (``arrays[r]``) in ``library``'s array type.

    Libraries that import the read-only results zero-copy get them so. An immutable
    library that cannot (JAX) gets one aligned copy of each distinct result buffer,
    imported zero-copy into one array per replica: the copy is reachable only through
    those immutable arrays. Other libraries (PyTorch) get a copy per replica, since
    their arrays can be written.
    """
    if library.name not in _COPY_OUT:
        out = [from_host(arrays[0], library)]
        if library.name not in _COPY_OUT:
            return out + [from_host(a, library) for a in arrays[1:]]
    if library.name not in _IMMUTABLE:
        return [from_host(a, library) for a in arrays]
    # One import per distinct result buffer (JAX: ~50 us for 1 MiB, more than the
    # collective); the other replicas sharing it get their own array of that buffer.
    imported: dict[tuple[int, tuple[int, ...], tuple[int, ...], str], object] = {}
    out = []
    for a in arrays:
        array = np.asarray(a)
        key = (array.ctypes.data, array.shape, array.strides, array.dtype.str)
        first = imported.get(key)
        if first is None:
            copy = _aligned_copy(array)
            try:
                first = library.namespace.from_dlpack(copy)
            except (BufferError, TypeError, RuntimeError, ValueError):
                first = library.namespace.asarray(copy)
            imported[key] = first
            out.append(first)
        else:
            out.append(_another(first, library))
    return out


def _another(array: Any, library: Library) -> object:
    """A new array of ``library`` (immutable) on ``array``'s buffer: one per replica."""
    if library.name == "jax.Array":
        import jax

        # Public JAX API; zero-copy, and a third of the cost of another DLPack import.
        return jax.make_array_from_single_device_arrays(array.shape, array.sharding, [array])
    return library.namespace.from_dlpack(array)
