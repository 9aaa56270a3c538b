"""Which tests the interpreted pass runs: those that run the library in the test process.

The README's test command runs the suite twice: on the compiled hot path, then with
``ASYNCREPLICA_NO_EXTENSIONS=1`` on the interpreted one, where the second pass is
``-m "not out_of_process"``. Only the test process itself switches implementations in a
way the suite can compare; a test that runs the library only in child processes
(``mpiexec`` jobs, the docs examples, the installed command) or not at all (mypy, ruff,
the docs site, file checks) checks nothing more the second time, and is marked
``out_of_process`` by tests/conftest.py from this module's reading of its source.

The reading is conservative: a test counts as running the library in process unless its
source, the module-level helpers and fixtures it uses (transitively; a helper imported
from another ``test_`` module of its folder is read in that module), and its decorators
reference nothing that could reach it: no name imported from a module outside the
standard library and pytest, no import inside a function, no dynamic import or ``exec``,
no fixture other than ``tmp_path``, ``tmp_path_factory``, ``capsys``, ``capfd`` and
``monkeypatch`` (``pytester`` runs pytest in process) besides the module's own (its
``autouse`` ones included), and no method of a class. A new
test is therefore in both passes unless it plainly is not. tests/test_passes.py checks
the rule.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = "out_of_process"
SAFE_FIXTURES = frozenset({"tmp_path", "tmp_path_factory", "capsys", "capfd", "monkeypatch"})
# Modules whose names a test may use without running the library: the standard library
# (subprocess among them) and pytest itself.
SAFE_MODULES = frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "__future__"}
# Calls that import or run code in this process whatever their module is.
DYNAMIC = frozenset(
    {"__import__", "import_module", "exec_module", "run_path", "run_module", "exec", "eval"}
)
RUNNERS = frozenset({"subprocess"})
# Library functions that do not reach the hot path, by module: finding the mpiexec
# executable (tests/test_passes.py checks that the module imports none of the hot path).
ALLOWED = {"asyncreplica._launch": frozenset({"find_mpiexec"})}


@dataclass(frozen=True)
class _Module:
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    autouse: frozenset[str]  # fixtures every test of the module uses
    usefixtures: bool  # its pytestmark adds fixtures by name
    unsafe: frozenset[str]  # module-level names that may reach the library
    runners: frozenset[str]  # module-level names bound to subprocess
    # names imported from another test module of the same folder (``from test_mpi import
    # launch``): read there, by the same rules, as that module's own helpers
    helpers: dict[str, tuple[Path, str]]


def _root(module: str | None) -> str:
    return (module or "").split(".")[0]


def _names(node: ast.AST) -> set[str]:
    """Every name ``node`` reads, and the attribute names it calls through."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)  # so that importlib.import_module is seen
    return found


@functools.cache
def _module(path: Path) -> _Module:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    unsafe: set[str] = set()
    runners: set[str] = set()
    autouse: set[str] = set()
    usefixtures = False
    helpers: dict[str, tuple[Path, str]] = {}
    assigned: list[tuple[list[str], ast.AST]] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                source = module if module is not None else alias.name
                sibling = path.parent / f"{source}.py" if source else None
                if isinstance(node, ast.ImportFrom) and node.level:
                    unsafe.add(bound)  # a relative import: a helper of the suite
                elif (
                    isinstance(node, ast.ImportFrom)
                    and sibling is not None
                    and source is not None
                    and source.startswith("test_")
                    and sibling.is_file()
                ):
                    helpers[bound] = (sibling, alias.name)
                elif alias.name in ALLOWED.get(source or "", ()):
                    continue
                elif _root(source) in RUNNERS:
                    runners.add(bound)
                elif _root(source) not in SAFE_MODULES:
                    unsafe.add(bound)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions[node.name] = node
            if any(
                isinstance(d, ast.Call)
                and any(
                    k.arg == "autouse"
                    and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                    for k in d.keywords
                )
                for d in node.decorator_list
            ):
                autouse.add(node.name)
        elif isinstance(node, ast.ClassDef):
            unsafe.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            if node.value is not None:
                assigned.append((names, node.value))
                if "pytestmark" in names and "usefixtures" in _names(node.value):
                    usefixtures = True
    # A module-level value computed from an unsafe name (or by a helper) is unsafe too.
    changed = True
    while changed:
        changed = False
        for names, value in assigned:
            used = _names(value)
            if (used & (unsafe | DYNAMIC) or used & set(functions)) and not set(names) <= unsafe:
                unsafe.update(names)
                changed = True
    return _Module(
        functions, frozenset(autouse), usefixtures, frozenset(unsafe), frozenset(runners), helpers
    )


def _parametrized(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The argument names of the function's ``parametrize`` decorators."""
    names: set[str] = set()
    for decorator in function.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "parametrize"
            and decorator.args
            and isinstance(decorator.args[0], ast.Constant)
            and isinstance(decorator.args[0].value, str)
        ):
            names.update(n.strip() for n in decorator.args[0].value.split(","))
        elif (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "parametrize"
            and decorator.args
            and isinstance(decorator.args[0], ast.Tuple | ast.List)
        ):
            names.update(
                e.value
                for e in decorator.args[0].elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return names


def classify(path: Path, name: str) -> str:
    """``"in process"``, ``"child processes"`` or ``"no library"`` for test ``name`` of ``path``."""
    module = _module(path)
    if name not in module.functions or module.usefixtures:
        return (
            "in process"  # a method, defined elsewhere (a shared test class), or fixtures by name
        )
    seen: set[tuple[Path, str, bool]] = set()
    # (module, function, whether pytest calls it: its parameters are fixtures)
    todo = [(path, name, True), *((path, fixture, True) for fixture in module.autouse)]
    uses_runner = False
    while todo:
        where, current, by_pytest = todo.pop()
        if (where, current, by_pytest) in seen:
            continue
        seen.add((where, current, by_pytest))
        module = _module(where)
        if current not in module.functions:
            return "in process"  # an imported name that is not a function of its module
        function = module.functions[current]
        for node in ast.walk(function):
            if isinstance(node, ast.Import | ast.ImportFrom) and not all(
                _root(a.name if isinstance(node, ast.Import) else node.module) in SAFE_MODULES
                for a in node.names
            ):
                return "in process"
        used = _names(function)
        if used & module.unsafe or used & DYNAMIC or "usefixtures" in used:
            return "in process"
        uses_runner = uses_runner or bool(used & module.runners)
        fixtures: set[str] = set()
        if by_pytest:
            params = {a.arg for a in [*function.args.args, *function.args.kwonlyargs]}
            fixtures = params - _parametrized(function) - SAFE_FIXTURES
            if fixtures - set(module.functions):
                return "in process"  # a fixture this reading cannot see into
        todo.extend((where, n, False) for n in used if n in module.functions)
        todo.extend((*module.helpers[n], False) for n in used if n in module.helpers)
        todo.extend((where, n, True) for n in fixtures)
    return "child processes" if uses_runner else "no library"


def out_of_process(path: Path, name: str) -> bool:
    """Whether the interpreted pass may leave the test out."""
    return classify(path, name) != "in process"
