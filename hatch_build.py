"""Hatchling build hook: compile the collective's hot path with mypyc, or install pure Python.

The modules listed in ``[tool.hatch.build.targets.wheel.hooks.custom] modules`` (pyproject.toml)
are compiled with mypyc into extension modules placed next to their ``.py`` sources, which stay
the one source of truth: they run interpreted when nothing was compiled, and when
``ASYNCREPLICA_NO_EXTENSIONS=1`` is set at run time (see ``asyncreplica/_compiled.py``).

The build never fails for want of a compiler. Compilation is skipped, with a one-line notice on
stderr, when ``ASYNCREPLICA_NO_EXTENSIONS=1`` is set at build time, when no C compiler or no
Python headers are found, when the compiler fails on a two-line test file (checked first, in
a second, before mypyc's type check spends a minute or two), or when mypyc or the compiler
fails. What happened is recorded in ``asyncreplica/_build_info.json`` (status, a short reason,
the compiler's or mypyc's output as ``detail``, modules, a checksum of each compiled source,
whether the install was editable), which ``asyncreplica doctor`` and the test suite read.
pip shows the build's notices only with ``-v``; ``asyncreplica doctor`` prints the reason.

A second step compiles one hand-written C extension, the numpy backend's single pass over a
batched all_reduce (``backends/asyncreplica_numpy/_cpass.c``, :data:`C_EXTENSIONS`), against
numpy's C API: numpy is a runtime dependency, so it is in the build environment whenever a
compiler is (see :meth:`MypycBuildHook.dependencies`). It follows the same rules, independently
of mypyc: it never fails the install (no compiler, no numpy at build time, a compiler error: the
pure-Python pass runs), ``ASYNCREPLICA_NO_EXTENSIONS=1`` skips it, and the record's
``c_extensions`` entry says what happened to it.

A regular wheel gets the extension modules from a temporary folder (the wheel is then tagged for
this platform); an editable install (``pip install -e .``) builds them in place, in the source
tree (ignored by git), because the package is imported from there.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ENV_VAR = "ASYNCREPLICA_NO_EXTENSIONS"
"""Set to ``1`` at build time to install pure Python (at run time: to run it)."""

BUILD_INFO = "asyncreplica/_build_info.json"
"""Where the build's record goes, relative to the project root (or the wheel's root)."""

GROUP = "asyncreplica._mypyc"
"""mypyc's group name: the shared library is ``asyncreplica/_mypyc__mypyc.*.so``."""

C_EXTENSIONS = {"asyncreplica_numpy._cpass": "backends/asyncreplica_numpy/_cpass.c"}
"""Hand-written C extension modules (numpy's C API) and their sources, relative to the root."""

BUILD_REQUIRES = ["mypy>=1.11", "setuptools>=65"]
"""What compiling needs besides the runtime dependencies (mypyc type-checks against them)."""


def _disabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip() not in ("", "0")


def _notice(message: str) -> None:
    print(f"asyncreplica: {message}", file=sys.stderr, flush=True)  # noqa: T201


REASON_CHARS = 160
"""The most characters of a recorded reason (``doctor`` prints it on one line)."""

DETAIL_CHARS = 4000
"""The most characters of the compiler's or mypyc's output kept in the record as ``detail``."""

PROBE_SOURCE = "#include <Python.h>\nint asyncreplica_probe(void) { return 0; }\n"
"""What the compiler must compile before mypyc runs: the smallest use of the Python headers."""


def _short(text: str) -> str:
    """The first line of ``text``, cut to :data:`REASON_CHARS`."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def _detail(text: str) -> str:
    """The end of a build log, where the error is, cut to :data:`DETAIL_CHARS`."""
    text = text.strip()
    return text if len(text) <= DETAIL_CHARS else "..." + text[-DETAIL_CHARS:]


def _failure(prefix: str, error: BaseException, log: str, marker: str) -> dict[str, str]:
    """A record's reason (short: the first line with ``marker``, else the exception) and detail.

    A build log holds warnings and whole command lines (600 characters of flags, some of
    them ``-Werror=...``); the reason is the line that says what failed, and the log goes
    into ``detail``.
    """
    lines = [line.strip() for line in log.splitlines() if marker in line]
    what = lines[0] if lines else f"{type(error).__name__}: {error}"
    return {"reason": f"{prefix}: {_short(what)}", "detail": _detail(f"{log}\n{error}")}


@functools.cache
def _toolchain_problem(cc: str, include: str) -> tuple[str, str] | None:
    """``(reason, detail)`` when ``cc`` cannot build against ``include``, else None.

    Compiles :data:`PROBE_SOURCE` as setuptools would (``cc -I include -c``), so a missing
    or broken compiler (``CC=/bin/false``) is found in a second, not after mypyc's type check.
    """
    words = shlex.split(cc)
    if not words or shutil.which(words[0]) is None:
        return f"no C compiler ({words[0] if words else 'CC'!r} not found)", ""
    if not pathlib.Path(include, "Python.h").is_file():
        return f"no Python headers (Python.h not in {include})", ""
    with tempfile.TemporaryDirectory(prefix="asyncreplica-probe-") as tmp:
        source = pathlib.Path(tmp, "probe.c")
        source.write_text(PROBE_SOURCE)
        command = [*words, "-I", include, "-c", str(source), "-o", str(source.with_suffix(".o"))]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError) as error:
            return f"the C compiler {words[0]!r} cannot run: {_short(str(error))}", str(error)
    if proc.returncode != 0:
        output = (proc.stderr + proc.stdout).strip()
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        said = f": {_short(errors[0])}" if errors else ""
        reason = f"the C compiler {words[0]!r} failed on a test file (exit {proc.returncode}){said}"
        return _short(reason), _detail(f"{shlex.join(command)}\n{output}")
    return None


def _missing_toolchain() -> tuple[str, str] | None:
    """Why no extension module can be built here (reason, detail), or ``None``."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return _toolchain_problem(cc, sysconfig.get_paths().get("include", ""))


def _digest(path: pathlib.Path) -> str:
    """What tells an edited source from the compiled one (as ``asyncreplica._compiled``)."""
    data = path.read_bytes()
    return f"{zlib.crc32(data):08x}-{len(data)}"


def _extension_files(directory: pathlib.Path, modules: list[str]) -> list[pathlib.Path]:
    """The extension files under ``directory`` for ``modules`` and the mypyc group library."""
    found: list[pathlib.Path] = []
    for name in [*modules, f"{GROUP}__mypyc"]:
        parent = directory.joinpath(*name.split(".")[:-1])
        found.extend(parent.glob(name.rsplit(".", 1)[-1] + ".*.so"))
        found.extend(parent.glob(name.rsplit(".", 1)[-1] + ".*.pyd"))
    return found


def _package_dir(root: pathlib.Path, module: str) -> pathlib.Path:
    """Where an editable install imports ``module``'s package from (the C source's folder)."""
    return root.joinpath(C_EXTENSIONS[module]).parent


def _previous_modules(root: pathlib.Path) -> list[str]:
    """The modules the last build in this tree compiled, from its record."""
    try:
        modules = json.loads(root.joinpath(BUILD_INFO).read_text()).get("modules", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [m for m in modules if isinstance(m, str)] if isinstance(modules, list) else []


class MypycBuildHook(BuildHookInterface):
    """Compile the hot-path modules with mypyc when possible; never fail the build for it."""

    PLUGIN_NAME = "custom"

    def _modules(self) -> list[str]:
        modules = self.config.get("modules", [])
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise TypeError("the custom build hook's `modules` must be a list of module names")
        return modules

    def dependencies(self) -> list[str]:
        """The packages compiling needs (none when compilation is disabled or impossible)."""
        if _disabled() or _missing_toolchain() is not None:
            return []
        return [*BUILD_REQUIRES, *self.metadata.core.dependencies]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile (or explain why not) and hand the files to the wheel."""
        if self.target_name != "wheel":
            return
        root = pathlib.Path(self.root)
        modules = self._modules()
        editable = version == "editable"
        if editable:
            # Extension modules from an earlier build (of these modules, or of those it was
            # asked for then) would shadow the sources.
            for stale in _extension_files(root, sorted({*modules, *_previous_modules(root)})):
                stale.unlink()
        self._tmp = pathlib.Path(tempfile.mkdtemp(prefix="asyncreplica-build-"))
        out = root if editable else self._tmp / "lib"
        info: dict[str, Any] = {
            "status": "",
            "reason": "",
            "modules": modules,
            "sources": {},
            "editable": editable,
        }
        if _disabled():
            info.update(status="disabled", reason=f"{ENV_VAR}=1 at build time")
        elif (missing := _missing_toolchain()) is not None:
            info.update(status="unavailable", reason=missing[0], detail=missing[1])
        else:
            info.update(self._compile(root, modules, out, editable))
        info["c_extensions"] = self._compile_c(root, editable, build_data)
        if info["status"] == "compiled":
            info["sources"] = {
                m: _digest(root.joinpath(*m.split(".")).with_suffix(".py")) for m in modules
            }
            _notice(
                f"compiled {len(modules)} modules with mypyc "
                f"({'in place' if editable else 'into the wheel'}) in {info['seconds']} s"
            )
            if not editable:
                for path in _extension_files(out, modules):
                    build_data["force_include"][str(path)] = path.relative_to(out).as_posix()
                build_data["pure_python"] = False
                build_data["infer_tag"] = True
        else:
            info.pop("seconds", None)
            _notice(
                f"installing pure Python, not compiled ({info['status']}: {info['reason']}); "
                "it runs the same, slower"
            )
        record = json.dumps(info, indent=1, sort_keys=True) + "\n"
        if editable:
            root.joinpath(BUILD_INFO).write_text(record)
        else:
            path = self._tmp / "_build_info.json"
            path.write_text(record)
            build_data["force_include"][str(path)] = BUILD_INFO

    def _compile(
        self, root: pathlib.Path, modules: list[str], out: pathlib.Path, inplace: bool
    ) -> dict[str, Any]:
        """Run mypyc and the C compiler; the record's status, reason and duration."""
        started = time.monotonic()
        log = io.StringIO()
        previous = pathlib.Path.cwd()
        try:
            os.chdir(root)  # mypyc reads [tool.mypy] from pyproject.toml here
            with contextlib.redirect_stdout(log):
                from mypyc.build import mypycify
                from setuptools import Distribution

                paths = [str(pathlib.Path(*m.split(".")).with_suffix(".py")) for m in modules]
                # Optional packages (trio, uvloop, ...) are not in the build environment:
                # their types do not matter to the compiled modules, and `mypy` in the test
                # suite checks the code strictly with them installed. Missing, they are Any,
                # so a class of theirs subclassed (trio.abc.Instrument) is a subclass of Any.
                paths += [
                    "--ignore-missing-imports",
                    "--no-warn-unused-ignores",
                    "--allow-subclassing-any",
                ]
                extensions = mypycify(
                    paths, group_name=GROUP, target_dir=str(self._tmp / "c"), opt_level="3"
                )
                distribution = Distribution({"name": "asyncreplica", "ext_modules": extensions})
                command: Any = distribution.get_command_obj("build_ext")
                command.build_lib = str(out)
                command.build_temp = str(self._tmp / "obj")
                command.inplace = inplace
                command.parallel = os.cpu_count() or 1
                distribution.run_command("build_ext")
        except (Exception, SystemExit) as error:  # the install must go on without extensions
            # mypy's errors say "file.py:12: error: ..."; without one, the exception says
            # what failed (the compiler), not the log's first line (often a mypyc warning).
            return {
                "status": "failed",
                **_failure("mypyc build failed", error, log.getvalue(), ": error:"),
            }
        finally:
            os.chdir(previous)
        return {"status": "compiled", "reason": "", "seconds": round(time.monotonic() - started)}

    def _compile_c(
        self, root: pathlib.Path, editable: bool, build_data: dict[str, Any]
    ) -> dict[str, dict[str, str]]:
        """Build :data:`C_EXTENSIONS` (never failing); each one's status, reason and source digest."""
        if editable:
            for module in C_EXTENSIONS:  # an old build would shadow a failed or skipped one
                folder = _package_dir(root, module)
                stem = module.rsplit(".", 1)[-1]
                for stale in [*folder.glob(f"{stem}.*.so"), *folder.glob(f"{stem}.*.pyd")]:
                    stale.unlink()
        records: dict[str, dict[str, str]] = {}
        for module, source in C_EXTENSIONS.items():
            record = {"status": "", "reason": "", "source": ""}
            if _disabled():
                record.update(status="disabled", reason=f"{ENV_VAR}=1 at build time")
            elif (missing := _missing_toolchain()) is not None:
                record.update(status="unavailable", reason=missing[0], detail=missing[1])
            else:
                record.update(self._build_c(root, module, source, editable, build_data))
            if record["status"] == "compiled":
                record["source"] = _digest(root / source)
                _notice(f"compiled {module} (C, numpy's C API)")
            else:
                _notice(
                    f"{module} not compiled ({record['status']}: {record['reason']}); "
                    "its pure-Python counterpart runs"
                )
            records[module] = record
        return records

    def _build_c(
        self,
        root: pathlib.Path,
        module: str,
        source: str,
        editable: bool,
        build_data: dict[str, Any],
    ) -> dict[str, str]:
        """Compile one C extension module; its record's status and reason."""
        log = io.StringIO()
        lib = self._tmp / "c-lib"
        try:
            import numpy
        except ImportError as error:
            return {"status": "unavailable", "reason": f"numpy is not importable: {error}"}
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                from setuptools import Distribution, Extension

                extension = Extension(
                    module,
                    [str(root / source)],
                    include_dirs=[numpy.get_include()],
                )
                distribution = Distribution({"name": "asyncreplica", "ext_modules": [extension]})
                command: Any = distribution.get_command_obj("build_ext")
                command.build_lib = str(lib)
                command.build_temp = str(self._tmp / "c-obj")
                distribution.run_command("build_ext")
            (built,) = [
                path
                for path in lib.joinpath(*module.split(".")[:-1]).iterdir()
                if path.name.startswith(module.rsplit(".", 1)[-1] + ".")
            ]
            if editable:
                shutil.copy2(built, _package_dir(root, module) / built.name)
        except (Exception, SystemExit) as error:  # the install must go on without it
            # gcc and clang say "file.c:12:5: error: ..."; the command line before it (with
            # its -Werror=... flags) is detail, not the reason.
            return {
                "status": "failed",
                **_failure("C compiler failed", error, log.getvalue(), ": error:"),
            }
        if not editable:
            build_data["force_include"][str(built)] = built.relative_to(lib).as_posix()
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
        return {"status": "compiled", "reason": ""}

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the temporary build folder once the wheel is written."""
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
