"""``asyncreplica doctor``: what this installation can run, and why not.

:func:`diagnose` collects the facts as plain data (a :class:`Diagnosis`); :func:`render_text`
turns them into the report the command prints, and :meth:`Diagnosis.as_dict` into the JSON
that ``asyncreplica doctor --json`` prints. Nothing here runs replicas: backends are loaded,
asked :meth:`~asyncreplica.abc.Backend.check_available` and
:meth:`~asyncreplica.abc.Backend.default_devices`, and every failure is recorded as text
instead of raised.

MPI is probed without initialising it (``mpi4py.rc.initialize = False``), so the command is
safe to run on a login node.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import platform
import sys
from typing import Any

from .._launch import launched_by_mpiexec
from .._version import __version__

__all__ = [
    "MPI_INSTALL_HINT",
    "BackendInfo",
    "Diagnosis",
    "LoopInfo",
    "MpiInfo",
    "diagnose",
    "render_text",
]

MPI_INSTALL_HINT = "pip install 'asyncreplica[mpi]'"
"""How to install the MPI support, as the report prints it."""

_LOOPS = (("asyncio", None), ("uvloop", "uvloop"), ("trio", "trio"))
"""Each event loop the runtime supports, and the package that provides it (None: stdlib)."""


@dataclasses.dataclass(frozen=True)
class LoopInfo:
    """One event loop.

    Attributes:
        name: ``"asyncio"``, ``"uvloop"`` or ``"trio"``.
        installed: Whether it can be used here.
        version: Its version (Python's for asyncio), or ``None`` when not installed.
    """

    name: str
    installed: bool
    version: str | None


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """One backend found in the registry.

    Attributes:
        name: The name users pass as ``backend=``.
        target: Where it comes from: the entry point's ``module:Class`` (or the class's
            qualified name when registered at run time), ``None`` if unknown.
        distribution: ``"name version"`` of the package that installs it, if known.
        available: Whether it loads and its ``check_available()`` passes.
        error: Why it cannot be used (``"TypeName: message"``), ``None`` when available.
        default_devices: The devices a strategy on this backend uses when none are given;
            empty when the backend is unavailable.
        kernels: Whether the backend's device kernels compile here, as its optional
            ``kernel_check()`` classmethod says (``"compile ..."`` or ``"cannot compile:
            ..."``); ``None`` when it has no such check or nothing to say.
    """

    name: str
    target: str | None
    distribution: str | None
    available: bool
    error: str | None
    default_devices: tuple[str, ...]
    kernels: str | None = None


@dataclasses.dataclass(frozen=True)
class MpiInfo:
    """Whether multi-process runs over MPI are possible.

    Attributes:
        installed: Whether ``mpi4py`` imports.
        mpi4py_version: The version of mpi4py, when installed.
        library_version: The MPI library's own version string (first line), when it could
            be read.
        error: Why mpi4py or the MPI library could not be used, if it could not.
        hint: How to install it, when it is not installed.
        world_size: The number of processes, when launched by ``mpiexec`` (MPI is then
            initialised to ask); 1 otherwise.
        thread_level: The thread support MPI provides (when launched by ``mpiexec``) or
            that mpi4py will request (otherwise), e.g. ``"multiple"``.
        launched: Whether this process was started by ``mpiexec``.
    """

    installed: bool
    mpi4py_version: str | None
    library_version: str | None
    error: str | None
    hint: str | None
    world_size: int | None = None
    thread_level: str | None = None
    launched: bool = False


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Everything ``asyncreplica doctor`` reports.

    Attributes:
        version: The version of asyncreplica.
        python: The Python version (``sys.version``'s first word).
        implementation: The Python implementation (``"cpython"``, ...).
        executable: The interpreter's path.
        platform: The operating system and machine, as :func:`platform.platform` says.
        loops: Each supported event loop.
        backends: Each backend found, sorted by name.
        default_devices: The devices ``MirroredStrategy()`` uses when given none, or
            ``None`` when that fails (see ``default_devices_error``).
        default_devices_error: Why the default devices could not be determined, if so.
        mpi: The state of MPI support.
        hot_path: Which implementation of the collective's hot path runs: ``"compiled
            (mypyc): N modules"`` or ``"interpreted: <why>"`` (see ``ASYNCREPLICA_NO_EXTENSIONS``
            in the installation docs).
        compiled_modules: The modules running as mypyc extension modules (empty when
            interpreted).
        batch_pass: Which single pass over a batched all_reduce the numpy backend runs:
            ``"compiled (C): asyncreplica_numpy._cpass"`` or ``"interpreted: <why>"``.
        build_output: Where the output of a compile that failed at install is kept (the
            build record's ``detail``), or ``""``; the reasons above are its short form.
    """

    version: str
    python: str
    implementation: str
    executable: str
    platform: str
    loops: tuple[LoopInfo, ...]
    backends: tuple[BackendInfo, ...]
    default_devices: tuple[str, ...] | None
    default_devices_error: str | None
    mpi: MpiInfo
    hot_path: str = ""
    compiled_modules: tuple[str, ...] = ()
    batch_pass: str = ""
    build_output: str = ""

    @property
    def ok(self) -> bool:
        """Whether at least one backend can run here."""
        return any(backend.available for backend in self.backends)

    def as_dict(self) -> dict[str, Any]:
        """Return the diagnosis as JSON-ready data (lists, dicts, strings, booleans)."""
        data = dataclasses.asdict(self)
        data["ok"] = self.ok
        return data


def _describe(error: BaseException) -> str:
    """One line: ``"TypeName: message"`` with the message's whitespace collapsed."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _package_version(package: str) -> str | None:
    """The installed version of ``package``, or ``None`` when it is not importable."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        module = importlib.import_module(package)
        return str(getattr(module, "__version__", "unknown version"))


def _loops() -> tuple[LoopInfo, ...]:
    found = []
    for name, package in _LOOPS:
        version = platform.python_version() if package is None else _package_version(package)
        found.append(LoopInfo(name, version is not None, version))
    return tuple(found)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The backends' entry points, as the registry found them."""
    from .._registry import _discover

    return dict(_discover())


def _backend(name: str, entry: importlib.metadata.EntryPoint | None) -> BackendInfo:
    from .._registry import load_backend_class

    target = entry.value if entry is not None else None
    distribution = None
    if entry is not None and entry.dist is not None:
        distribution = f"{entry.dist.name} {entry.dist.version}"
    try:
        cls = load_backend_class(name)
    except Exception as exc:
        # The registry wraps a plugin's import error; report the cause, not the wrapper.
        cause = getattr(exc, "load_error", None)
        error = _describe(cause if isinstance(cause, BaseException) else exc)
        return BackendInfo(name, target, distribution, False, error, ())
    if target is None:
        target = f"{cls.__module__}:{cls.__qualname__}"
    kernels = _kernel_check(cls)
    try:
        cls.check_available()
        devices = tuple(cls.default_devices())
    except Exception as exc:  # a probe that fails is a finding, never a crash
        return BackendInfo(name, target, distribution, False, _describe(exc), (), kernels)
    return BackendInfo(name, target, distribution, True, None, devices, kernels)


def _kernel_check(cls: type) -> str | None:
    """What a backend's optional ``kernel_check()`` says about compiling its kernels.

    The cupy backend compiles its kernels with NVRTC, which needs the CUDA headers; it
    checks that without a GPU. Backends without the classmethod have nothing to say.
    """
    check = getattr(cls, "kernel_check", None)
    if check is None:
        return None
    try:
        said = check()
    except Exception as exc:
        return f"cannot compile: {_describe(exc)}"
    return None if said is None else " ".join(str(said).split())


def _default_strategy_devices() -> tuple[tuple[str, ...] | None, str | None]:
    from .._runtime._strategy import _default_devices

    try:
        return tuple(_default_devices(None)), None
    except Exception as exc:
        return None, _describe(exc)


def _mpi() -> MpiInfo:
    if importlib.util.find_spec("mpi4py") is None:
        return MpiInfo(False, None, None, None, MPI_INSTALL_HINT)
    try:
        import mpi4py

        version = str(getattr(mpi4py, "__version__", "unknown version"))
        # Probe the library without MPI_Init: importing MPI must not start a world.
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI

        library = [
            " ".join(line.split()) for line in str(MPI.Get_library_version()).strip().splitlines()
        ]
        launched = launched_by_mpiexec()
        if launched:
            # Under mpiexec, initialising is what the program would do anyway.
            if not MPI.Is_initialized():
                MPI.Init_thread(MPI.THREAD_MULTIPLE)
            levels = {
                MPI.THREAD_SINGLE: "single",
                MPI.THREAD_FUNNELED: "funneled",
                MPI.THREAD_SERIALIZED: "serialized",
                MPI.THREAD_MULTIPLE: "multiple",
            }
            world = MPI.COMM_WORLD.Get_size()
            level = levels.get(MPI.Query_thread(), str(MPI.Query_thread()))
        else:
            world, level = 1, f"{mpi4py.rc.thread_level} (requested)"
    except Exception as exc:
        return MpiInfo(False, None, None, _describe(exc), MPI_INSTALL_HINT)
    return MpiInfo(
        True,
        version,
        library[0].strip() if library else None,
        None,
        None,
        world_size=world,
        thread_level=level,
        launched=launched,
    )


def _batch_pass() -> str:
    """The numpy backend's answer to which pass over a batch runs, or why it cannot say."""
    try:
        from asyncreplica_numpy._backend import batch_pass
    except Exception as error:  # the numpy backend itself is reported under backends
        return f"unknown: the numpy backend does not import ({_describe(error)})"
    return batch_pass()


def diagnose() -> Diagnosis:
    """Collect what this installation can run.

    Returns:
        The facts; failures are recorded in them as text, never raised.
    """
    from .. import _compiled
    from .._registry import available_backends

    entries = _entry_points()
    backends = tuple(_backend(name, entries.get(name)) for name in available_backends())
    devices, devices_error = _default_strategy_devices()
    return Diagnosis(
        version=__version__,
        python=platform.python_version(),
        implementation=sys.implementation.name,
        executable=sys.executable,
        platform=platform.platform(),
        loops=_loops(),
        backends=backends,
        default_devices=devices,
        default_devices_error=devices_error,
        mpi=_mpi(),
        hot_path=_compiled.current().describe(),
        compiled_modules=_compiled.compiled_modules(),
        batch_pass=_batch_pass(),
        build_output=_compiled.build_output(),
    )


def render_text(diagnosis: Diagnosis) -> str:
    """Render a diagnosis as the text report of ``asyncreplica doctor``.

    Args:
        diagnosis: What :func:`diagnose` returned.

    Returns:
        The report, several lines, without a trailing newline.
    """
    d = diagnosis
    lines = [
        f"asyncreplica {d.version}",
        f"python: {d.python} ({d.implementation}) at {d.executable}",
        f"platform: {d.platform}",
        f"hot path: {d.hot_path}",
        f"batch pass: {d.batch_pass}",
    ]
    if d.build_output:
        lines.append(f"build output: {d.build_output}")
    lines += ["event loops:"]
    for loop in d.loops:
        state = loop.version if loop.installed else f"not installed: pip install {loop.name}"
        suffix = " (standard library)" if loop.name == "asyncio" else ""
        lines.append(f"  {loop.name}: {state}{suffix}")
    lines.append("backends:")
    if not d.backends:
        lines.append("  none found (entry-point group 'asyncreplica.backends' is empty)")
    for backend in d.backends:
        origin = ", ".join(part for part in (backend.target, backend.distribution) if part)
        origin = f" ({origin})" if origin else ""
        if backend.available:
            devices = ", ".join(backend.default_devices) or "none"
            lines.append(f"  {backend.name}: ok{origin}; default devices: {devices}")
        else:
            lines.append(f"  {backend.name}: unavailable{origin}: {backend.error}")
        if backend.kernels is not None:
            lines.append(f"    kernels: {backend.kernels}")
    if d.default_devices is not None:
        lines.append(f"MirroredStrategy() default devices: {', '.join(d.default_devices)}")
    else:
        lines.append(f"MirroredStrategy() default devices: unknown: {d.default_devices_error}")
    mpi = d.mpi
    if mpi.installed:
        library = mpi.library_version or "library version unknown"
        lines.append(f"MPI: mpi4py {mpi.mpi4py_version}; {library}")
        how = "launched by mpiexec" if mpi.launched else "not launched by mpiexec"
        lines.append(
            f"MPI world: {mpi.world_size} process{'' if mpi.world_size == 1 else 'es'} "
            f"({how}); thread level {mpi.thread_level}"
        )
    elif mpi.error is not None:
        lines.append(f"MPI: unavailable: {mpi.error} ({mpi.hint})")
    else:
        lines.append(f"MPI: not installed: {mpi.hint}")
    if not d.ok:
        lines.append("no backend can run here: see the errors above")
    return "\n".join(lines)
