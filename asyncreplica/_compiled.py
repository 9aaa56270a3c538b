"""Which implementation of the hot path runs: mypyc-compiled extension modules or the sources.

``pip install`` compiles a few modules on the collective's path with mypyc when it can
(``hatch_build.py``) and records what it did in ``_build_info.json`` next to this file. The
``.py`` sources stay installed and are the one source of truth; they run instead of the
extension modules when:

* ``ASYNCREPLICA_NO_EXTENSIONS=1`` is set at run time, or
* a compiled module's source changed since the build (an edited editable install), so the
  extension module would run old code.

Extension modules shadow ``.py`` files in the same folder, so running the sources takes a
meta-path finder that loads exactly those module names with :class:`SourceFileLoader`.
:func:`select` installs it; ``asyncreplica/__init__.py`` calls it before importing any other
submodule. This module imports only the standard library.

The build also compiles hand-written C extension modules (``c_extensions`` in the record: the
numpy backend's single pass over a batch). They have no ``.py`` twin to route imports to: the
module that uses one asks :func:`c_extension_reason` whether to import it, and runs its
pure-Python counterpart otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import pathlib
import sys
import zlib
from collections.abc import Sequence
from types import ModuleType

__all__ = [
    "ENV_VAR",
    "Implementation",
    "build_output",
    "c_extension_reason",
    "compiled_modules",
    "current",
    "select",
]

ENV_VAR = "ASYNCREPLICA_NO_EXTENSIONS"
"""Set to ``1`` (at build time or at run time) for the interpreted modules."""

_HERE = pathlib.Path(__file__).resolve().parent
_BUILD_INFO = _HERE / "_build_info.json"


@dataclasses.dataclass(frozen=True)
class Implementation:
    """What the installation holds and what this process runs.

    Attributes:
        compiled: Whether the compiled modules run in this process.
        modules: The modules the build compiled (or was asked to), dotted names.
        build_status: ``"compiled"``, ``"disabled"`` (``ASYNCREPLICA_NO_EXTENSIONS=1`` at build
            time), ``"unavailable"`` (no C compiler or no Python headers), ``"failed"``, or
            ``"unknown"`` (no build record: not installed by pip).
        reason: Why the interpreted modules run; empty when the compiled ones do.
    """

    compiled: bool
    modules: tuple[str, ...]
    build_status: str
    reason: str

    def describe(self) -> str:
        """One line: ``compiled (mypyc): 6 modules`` or ``interpreted: <reason>``."""
        if self.compiled:
            return f"compiled (mypyc): {len(self.modules)} modules"
        return f"interpreted: {self.reason}"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` source of the named modules, never their extension modules."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or path is None:
            return None
        loaders = [(importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)]
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, *loaders).find_spec(fullname, target)
            if spec is not None:
                return spec
        return None


def _zip_archive() -> str | None:
    """The zip archive this package is imported from (zipimport), or None."""
    for parent in _HERE.parents:
        if parent.is_file():
            return parent.name
    return None


def _no_record() -> str:
    """Why there is no build record: imported from a zip, or not installed by pip."""
    archive = _zip_archive()
    if archive is not None:
        return f"imported from the zip archive {archive}, where extension modules cannot load"
    return "no build record (_build_info.json): not installed with pip"


def _reinstall(info: dict[str, object]) -> str:
    """The command that compiles a changed source again, for the kind of install recorded."""
    editable = info.get("editable")
    if editable is True:
        return "reinstall (pip install -e .) to compile it again"
    if editable is False:
        return (
            "the installed copy was edited; reinstall asyncreplica (pip install --force-reinstall) "
            "to compile it again"
        )
    return "reinstall (pip install -e . for a checkout) to compile it again"


def _read_build_info() -> dict[str, object]:
    try:
        info = json.loads(_BUILD_INFO.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _source(module: str) -> pathlib.Path:
    return _HERE.parent.joinpath(*module.split(".")).with_suffix(".py")


def _digest(path: pathlib.Path) -> str:
    """CRC-32 and size of a source (zlib: no OpenSSL to load at import, as hashlib would)."""
    data = path.read_bytes()
    return f"{zlib.crc32(data):08x}-{len(data)}"


def _stale(sources: dict[str, str]) -> str | None:
    """The first compiled module whose source changed since the build, as a path."""
    for module, digest in sources.items():
        path = _source(module)
        try:
            current_digest = _digest(path)
        except OSError:
            continue
        if current_digest != digest:
            return f"{path.parent.name}/{path.name}"
    return None


def _decide() -> Implementation:
    info = _read_build_info()
    raw_modules = info.get("modules", [])
    modules = (
        tuple(m for m in raw_modules if isinstance(m, str)) if isinstance(raw_modules, list) else ()
    )
    status = str(info.get("status", "unknown"))
    if status == "unknown":
        return Implementation(False, modules, status, _no_record())
    if status != "compiled":
        reason = f"not compiled at install ({status}: {info.get('reason', '')})"
        return Implementation(False, modules, status, reason)
    if os.environ.get(ENV_VAR, "").strip() not in ("", "0"):
        return Implementation(False, modules, status, f"{ENV_VAR}=1 at run time")
    raw_sources = info.get("sources", {})
    sources = raw_sources if isinstance(raw_sources, dict) else {}
    changed = _stale({str(k): str(v) for k, v in sources.items()})
    if changed is not None:
        reason = f"{changed} changed since it was compiled; {_reinstall(info)}"
        return Implementation(False, modules, status, reason)
    return Implementation(True, modules, status, "")


def c_extension_reason(module: str, source: pathlib.Path) -> str | None:
    """Why the C extension ``module`` must not run, or None when it may be imported.

    Args:
        module: The extension's dotted name, as in the build record's ``c_extensions``.
        source: Its C source next to it; when present and changed since the build (an edited
            editable install), the extension would run old code, so it does not run.

    Returns:
        None, or the reason in a few words (for ``asyncreplica doctor``).
    """
    info = _read_build_info()
    if not info:
        return _no_record()
    if os.environ.get(ENV_VAR, "").strip() not in ("", "0"):
        return f"{ENV_VAR}=1 at run time"
    records = info.get("c_extensions", {})
    record = records.get(module) if isinstance(records, dict) else None
    if not isinstance(record, dict):
        return "not built at install (the build did not know it)"
    status = str(record.get("status", "unknown"))
    if status != "compiled":
        return f"not compiled at install ({status}: {record.get('reason', '')})"
    try:
        changed = _digest(source) != record.get("source")
    except OSError:
        changed = False  # a wheel may ship without the C source
    if changed:
        return (
            f"{source.parent.name}/{source.name} changed since it was compiled; {_reinstall(info)}"
        )
    return None


def build_output() -> str:
    """Where the compiler's or mypyc's output of a failed compile is, or ``""``.

    The build records a short reason (what ``doctor`` prints) and keeps the output as
    ``detail`` in the build record; this names the record when one of its details is set.
    """
    info = _read_build_info()
    records = info.get("c_extensions", {})
    details = [info.get("detail")]
    if isinstance(records, dict):
        details += [r.get("detail") for r in records.values() if isinstance(r, dict)]
    return f'"detail" in {_BUILD_INFO}' if any(details) else ""


_CURRENT: Implementation | None = None


def select() -> Implementation:
    """Decide once per process which modules run; route imports to the sources if interpreted.

    Must run before any of the compiled modules is imported (``asyncreplica/__init__.py``
    calls it first). Later calls return the first decision.
    """
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = _decide()
        if not _CURRENT.compiled and _CURRENT.modules:
            sys.meta_path.insert(0, _SourceFinder(_CURRENT.modules))
    return _CURRENT


def current() -> Implementation:
    """The decision :func:`select` made for this process."""
    return select()


def compiled_modules() -> tuple[str, ...]:
    """The hot-path modules that are actually running as extension modules in this process.

    Imports each module the build compiled and looks at where it came from, so a test can
    check what runs rather than what was intended.
    """
    compiled: list[str] = []
    for name in current().modules:
        module = importlib.import_module(name)
        spec = module.__spec__
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            compiled.append(name)
    return tuple(compiled)


select()
