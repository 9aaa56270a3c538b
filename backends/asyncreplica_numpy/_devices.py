"""Where other libraries' arrays live: which backend serves a device, and results' placement.

Shared by the backends that accept *foreign* arrays (numpy, cupy, mpi):

* :func:`unserved_device_error` is the ``BackendError`` for an array on a device the
  backend it reached cannot hold (a CUDA tensor in a CPU strategy, a ROCm or Metal
  array anywhere): it names the backend and the extra that serve the device, if any;
* :func:`place_like` puts each replica's result on its own input's device (a JAX array
  on CPU device 3 in, a JAX array on CPU device 3 out), through ``array-api-compat``.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncreplica import BackendError

from ._foreign import Library, from_host_shared

__all__ = [
    "DLPACK_DEVICE_NAMES",
    "place_like",
    "restore_host",
    "several_devices",
    "unserved_device_error",
]

#: DLPack's device types (``dlpack.h``, ``DLDeviceType``) by number.
DLPACK_DEVICE_NAMES = {
    1: "CPU",
    2: "CUDA",
    3: "CUDA pinned host",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm pinned host",
    12: "ExtDev",
    13: "CUDA managed",
    14: "oneAPI",
    15: "WebGPU",
    16: "Hexagon",
    17: "MAIA",
}
_CUDA = 2

# What each backend holds, for the first sentence of the error.
_HOLDS = {
    "numpy": "which holds values on the CPU only",
    "cupy": "which holds values on CUDA GPUs (and copies CPU values there)",
    "mpi": "which moves values between processes through host memory only",
}
_GPU_ROUTE = (
    "the cupy backend serves CUDA arrays (CuPy, PyTorch, JAX, ...; each replica gets its "
    "results back in its own input's type and device): run the strategy on GPU devices, "
    "MirroredStrategy(['GPU:0', ...]) (backend='cupy'; install it with "
    "pip install 'asyncreplica[gpu]')"
)
_TO_CPU = (
    "or move the value to the CPU first (x.cpu() in PyTorch, "
    "jax.device_put(x, jax.devices('cpu')[0]) in JAX), where the numpy backend serves "
    "arrays of any library"
)


def _device_text(value: object) -> str:
    """The array's device as its library prints it (``cuda:0``), else ``?``."""
    try:
        import array_api_compat as compat

        return str(compat.device(value))
    except Exception:  # a library without a device attribute: DLPack's numbers say enough
        return "?"


def unserved_device_error(
    value: object, array_type: str, device_type: int, backend: str
) -> BackendError:
    """The error for an array on a device ``backend`` cannot hold.

    Args:
        value: The array (its device is printed as its library names it).
        array_type: Its array type as users know it (``"torch.Tensor"``).
        device_type: Its DLPack device type (``value.__dlpack_device__()[0]``).
        backend: The name of the backend it reached (``"numpy"``, ``"cupy"``, ``"mpi"``).

    Returns:
        A ``BackendError`` (to raise) that says which device the array is on, which
        backend and extra would serve it (or that none does yet), and how to move it.
    """
    where = DLPACK_DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")
    holds = _HOLDS.get(backend, "which cannot hold values on that device")
    if backend == "mpi":
        serve = (
            f"{where} values across processes are not supported yet: {_TO_CPU.removeprefix('or ')}"
        )
    elif device_type == _CUDA and backend != "cupy":
        serve = f"{_GPU_ROUTE}; {_TO_CPU}"
    else:
        serve = (
            f"no asyncreplica backend serves {where} devices yet (the cupy backend serves "
            f"CUDA GPUs, the numpy backend the CPU): {_TO_CPU.removeprefix('or ')}"
        )
    return BackendError(
        f"a {array_type} on {where} device {_device_text(value)} (DLPack device type "
        f"{device_type}) reached the {backend} backend, {holds}. {serve[0].upper()}{serve[1:]}"
    )


# Per (array type, host): whether the library shows several devices of that kind.
_SEVERAL: dict[tuple[str, bool], bool] = {}


def several_devices(library: Library, *, host: bool) -> bool:
    """Whether arrays of ``library`` may live on several devices (CPU ones if ``host``).

    With one device, every result is on its input's device already and
    :func:`place_like` has nothing to do: callers skip it. JAX counts its CPU (or GPU)
    devices; other libraries answer through the array API's
    ``__array_namespace_info__().devices()``; a library that cannot say counts as
    several. Cached per library (devices do not come and go within a process).
    """
    key = (library.name, host)
    several = _SEVERAL.get(key)
    if several is None:
        try:
            if library.name == "jax.Array":
                import jax

                try:
                    count = len(jax.devices("cpu" if host else "gpu"))
                except RuntimeError:  # no such backend in this jaxlib
                    count = 0
            else:
                count = len(library.namespace.__array_namespace_info__().devices())
            several = count > 1
        except Exception:  # no inspection API: check every result
            several = True
        _SEVERAL[key] = several
    return several


def place_like(
    results: list[object], inputs: Sequence[object], *, one_device: bool = False
) -> list[object]:
    """Each ``results[r]`` on the device of ``inputs[r]`` (same library, same order).

    Results made from one host buffer sit on the library's default device; a replica
    whose input lives elsewhere (JAX CPU device 3, ``array_api_strict``'s
    ``device1``, ``cuda:1``) gets its result moved there with ``array_api_compat``'s
    ``to_device``. Results already on their input's device, and arrays whose library
    has no ``device`` attribute, are returned as they are. ``one_device`` says that
    every result is on the device of ``results[0]`` (results made from host buffers):
    it is looked up once.
    """
    if not results:
        return results
    import array_api_compat as compat

    def device(x: object) -> object:
        # The standard's ``device`` attribute (JAX, PyTorch, array_api_strict, CuPy):
        # a third of array_api_compat's cost, which handles libraries without it.
        try:
            return x.device  # type: ignore[attr-defined]
        except AttributeError:
            return compat.device(x)

    out = results
    try:
        here = device(results[0]) if one_device else None
    except (AttributeError, TypeError, ValueError):
        return results  # an array without a device attribute: nothing to place it on
    for r, value in enumerate(inputs):
        try:
            want = device(value)
            if (here if one_device else device(results[r])) == want:
                continue
        except (AttributeError, TypeError, ValueError):
            continue
        if out is results:
            out = list(results)
        out[r] = compat.to_device(results[r], want)
    return out


def restore_host(
    results: list[list[object]],
    libraries: Sequence[Library | None],
    inputs: Sequence[Sequence[object]],
) -> list[list[object]]:
    """Each replica's host results in the array type and on the device of its input.

    ``results[r][j]`` is replica ``r``'s numpy result of leaf ``j``; ``libraries[j]``
    the leaf's :class:`Library` (None: it stays numpy); ``inputs[r]`` replica ``r``'s
    original leaves. Shared by the numpy and MPI backends.
    """
    out = [list(row) for row in results]
    for j, library in enumerate(libraries):
        if library is not None:
            converted = from_host_shared([row[j] for row in results], library)
            if several_devices(library, host=True):
                converted = place_like(converted, [row[j] for row in inputs], one_device=True)
            for row, value in zip(out, converted, strict=True):
                row[j] = value
    return out
