"""Arrays of other libraries on the CPU: JAX, array_api_strict, PyTorch, ...

A leaf that is not a numpy array, a numpy scalar or a Python number, but implements the
Python array API standard or DLPack, is a *foreign* leaf. The numpy backend holds it
as a numpy array (zero-copy: JAX's own numpy view, the numpy array an
``array_api_strict`` array wraps, ``np.from_dlpack`` otherwise) and gives each replica
its results back in its own input's array type: ``array_api_strict`` arrays on the
shared read-only buffer, JAX arrays on a buffer only JAX reaches, and a copy per
replica for libraries without read-only arrays (PyTorch).

``array_api_compat`` is imported on the first foreign leaf only: numpy inputs never
reach this module.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from asyncreplica import IndexedSlices

__all__ = [
    "Library",
    "aligned_empty",
    "from_host",
    "from_host_owned",
    "from_host_shared",
    "library_of",
    "takes_ownership",
    "to_host",
]

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
# Immutable array types: replicas may share one buffer that only the library can reach.
_IMMUTABLE = frozenset(("jax.Array",))
# JAX imports a host buffer through DLPack without a copy only when it is so aligned.
_ALIGN = 64
# Shardings of JAX arrays found on the CPU (DLPack's device check costs ~2 us a leaf).
_JAX_HOST_SHARDINGS: set[object] = set()
# Whether jax.Array's constructor makes another array on a buffer (see _another).
_JAX_DIRECT: list[bool] = []


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
    if library.name == "jax.Array":
        sharding = getattr(value, "sharding", None)
        if sharding is not None and sharding in _JAX_HOST_SHARDINGS:
            # Checked before (below): JAX's own numpy view of the buffer on the CPU,
            # zero-copy and cached on the array (a DLPack export costs ten times more).
            return np.asarray(value)
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
        if library.name == "jax.Array":
            sharding = getattr(value, "sharding", None)
            if sharding is not None:
                if len(_JAX_HOST_SHARDINGS) > 256:
                    _JAX_HOST_SHARDINGS.clear()
                _JAX_HOST_SHARDINGS.add(sharding)
            return np.asarray(value)
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

    See :func:`from_host_shared`, of which this is the one-replica case.
    """
    return from_host_shared([array], library)[0]


def _own_copy(array: object, library: Library) -> object:
    """A copy of ``array`` in ``library``'s type, which no other replica's result shares."""
    xp = library.namespace
    # The copy is made by numpy (writable) and handed over: asarray of a read-only
    # buffer warns in PyTorch even with copy=True, and imports a writable one in place.
    return xp.asarray(np.array(array, copy=True))


# array_api_strict: per numpy dtype, an array made by its public from_dlpack whose
# dtype and device later results copy (see _strict_array); None where not usable.
_STRICT_TEMPLATES: dict[np.dtype[Any], Any] = {}
_STRICT_SLOTS = frozenset(("_array", "_dtype", "_device", "__weakref__"))


def _strict_array(array: object, xp: Any) -> object:
    """``array`` (numpy) as an ``array_api_strict`` array on the same buffer.

    The public ``from_dlpack`` costs ~20 us a call (its constructor checks the dtype
    against every dtype it knows); a replica's result costs that per collective. The
    first result of each dtype is made by ``from_dlpack``; later ones are the same
    object with another buffer: its three slots set on a new instance. Guarded like
    ``to_host``'s ``_array``: only while the class has exactly those slots and the
    public result holds the numpy array itself; ``from_dlpack`` otherwise.
    """
    if type(array) is not np.ndarray:
        return xp.from_dlpack(array)
    template = _STRICT_TEMPLATES.get(array.dtype, False)
    if template is False:
        made = xp.from_dlpack(array)
        kind = type(made)
        usable = (
            frozenset(getattr(kind, "__slots__", ())) == _STRICT_SLOTS
            and getattr(made, "_array", None) is not None
            and np.shares_memory(made._array, array)
        )
        _STRICT_TEMPLATES[array.dtype] = made if usable else None
        return made
    if template is None:
        return xp.from_dlpack(array)
    made = object.__new__(type(template))
    made._array = array
    made._dtype = template._dtype
    made._device = template._device
    return made


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
    """A new, writable, C-contiguous array whose data is ``_ALIGN``-byte aligned."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def _aligned_copy(array: Array) -> Array:
    """A writable, C-contiguous copy of ``array`` whose data is ``_ALIGN``-byte aligned."""
    copy = aligned_empty(array.shape, array.dtype)
    np.copyto(copy, array)
    return copy


def takes_ownership(library: Library) -> bool:
    """Whether ``library`` should get results as buffers it owns: :func:`from_host_owned`.

    True for immutable libraries that import a writable, aligned host buffer zero-copy
    (JAX), where handing over a shared read-only buffer would cost a copy.
    """
    return library.name in _IMMUTABLE


def from_host_owned(array: Array, n: int, library: Library) -> list[object]:
    """``n`` arrays of ``library`` (immutable: JAX) on ``array``'s buffer, one per replica.

    ``array`` must be a new, writable result that nothing else references: the library
    imports it zero-copy (DLPack; JAX copies a buffer that is not ``_ALIGN``-aligned)
    and owns it from then on. The backend never reuses it; it is freed when the last
    replica's array is. No one can write into it: the library's arrays are immutable
    and the numpy array is not kept.
    """
    first = _import_owned(array, library)
    return [first, *[_another(first, library) for _ in range(n - 1)]]


def from_host_shared(arrays: list[object], library: Library) -> list[object]:
    """Each replica's numpy result (``arrays[r]``, read-only) in ``library``'s array type.

    ``array_api_strict`` gets them zero-copy: its arrays wrap the read-only numpy
    views. An immutable library (JAX), which cannot import a read-only buffer, gets
    one aligned copy of each distinct result buffer, imported zero-copy into one array
    per replica: the copy is reachable only through those immutable arrays. Any other
    library (PyTorch, which has no read-only tensors) gets a copy per replica, so that
    writing into one replica's result changes no other's.
    """
    if library.name == "array_api_strict.Array":
        return [_strict_array(a, library.namespace) for a in arrays]
    if library.name not in _IMMUTABLE:
        return [_own_copy(a, library) for a in arrays]
    # One import per distinct result buffer (JAX: ~30 us, more than a 1 KiB collective);
    # the other replicas sharing it get their own array of that buffer.
    imported: dict[tuple[int, tuple[int, ...], tuple[int, ...], str], object] = {}
    out = []
    for a in arrays:
        array = np.asarray(a)
        key = (array.ctypes.data, array.shape, array.strides, array.dtype.str)
        first = imported.get(key)
        if first is None:
            first = _import_owned(_aligned_copy(array), library)
            imported[key] = first
            out.append(first)
        else:
            out.append(_another(first, library))
    return out


def _import_owned(array: Array, library: Library) -> object:
    """``array`` (new, writable, referenced by nothing else) imported into ``library``."""
    try:
        return library.namespace.from_dlpack(array)
    except (BufferError, TypeError, RuntimeError, ValueError):
        return library.namespace.asarray(array)


def _another(array: Any, library: Library) -> object:
    """A new array of ``library`` (immutable) on ``array``'s buffer: one per replica."""
    if library.name == "jax.Array":
        import jax

        if _JAX_DIRECT and _JAX_DIRECT[0]:
            # jax.Array's own constructor, without the checks the public function below
            # repeats on every call (a third of its cost): guarded, see _jax_direct.
            return type(array)(
                array.aval, array.sharding, [array], committed=array.committed, _skip_checks=True
            )
        if not _JAX_DIRECT:
            return _jax_direct(array)
        # Public JAX API; zero-copy, and a third of the cost of another DLPack import.
        return jax.make_array_from_single_device_arrays(array.shape, array.sharding, [array])
    return library.namespace.from_dlpack(array)


def _jax_direct(array: Any) -> object:
    """Another JAX array on ``array``'s buffer, deciding once how to make it.

    ``jax.Array``'s constructor (``ArrayImpl(aval, sharding, arrays, committed,
    _skip_checks)``) is not public API: it is used only if the array it makes is of
    the same type, shape, dtype and buffer as ``array``; otherwise, and on any error,
    ``jax.make_array_from_single_device_arrays`` from then on.
    """
    import jax

    public: Any = jax.make_array_from_single_device_arrays(array.shape, array.sharding, [array])
    made: Any
    try:
        made = type(array)(
            array.aval, array.sharding, [array], committed=array.committed, _skip_checks=True
        )
        usable = (
            type(made) is type(public)
            and made.shape == array.shape
            and made.dtype == array.dtype
            and made.unsafe_buffer_pointer() == array.unsafe_buffer_pointer()
            and made is not array
        )
    except Exception:  # another JAX: its constructor is not this one
        usable = False
    _JAX_DIRECT.append(usable)
    return public
