"""A static check for collectives that not every replica reaches (``asyncreplica lint``).

A collective completes only when every replica reaches it. A collective inside a branch
or a loop whose condition depends on the replica id (``ctx.replica_id_in_sync_group``)
or on per-replica data (the step function's arguments, such as ``len(batch)``), or one
after an early ``return``/``break``/``continue`` under such a condition (or a ``raise``
there that a ``try``/``except`` or ``contextlib.suppress`` around it catches), is reached by
some replicas only: at run time asyncreplica raises ``ReplicaExitedError`` or
``CollectiveMismatchError``, but this check finds the line before anything runs. It is
the Python counterpart of PARCOACH for MPI programs in C.

The check reads the source with :mod:`ast`; it never imports or runs the code.

What is a collective:
    A call of ``all_reduce``, ``all_gather``, ``broadcast``, ``reduce_scatter``,
    ``barrier`` or ``merge_call`` whose receiver looks like a replica context
    (``get_replica_context()``, a name assigned from it, or a name such as ``ctx`` /
    ``context`` / ``replica_ctx``, or a parameter annotated as a context, or any name
    whose ``replica_id_in_sync_group`` the module reads). A call of a function defined in the same
    module that makes such a call counts as a collective too (one level deep), and so
    does a call of a name bound to a collective (``f = ctx.all_reduce``, or a lambda
    that makes one).

What is per-replica (tainted):
    * the replica id: any ``.replica_id_in_sync_group`` attribute (or ``getattr`` of
      it), and the result of a
      function of the same module that returns something derived from it;
    * the process rank, which differs between the processes of a multi-process run:
      ``Get_rank()`` (``MPI.COMM_WORLD.Get_rank()``), ``comm.rank``,
      ``cluster_resolver.task_id``, and the launchers' rank variables read from the
      environment (``os.environ["RANK"]``, ``os.getenv("OMPI_COMM_WORLD_RANK")``, ...);
    * per-replica data: the parameters of a function that makes collectives (other than
      ``self``, ``cls`` and context-like names such as ``ctx`` or ``strategy``). When such
      a function is only called from the same module and is not passed to ``.run(...)``,
      its parameters are as per-replica as the arguments its callers pass;
    * the result of ``reduce_scatter`` (each replica gets a different part);
    * anything computed from a tainted value: assignments, augmented assignments, tuple
      unpacking, attribute and subscript access, calls, comparisons, ``for`` targets.

Silencing: ``# asyncreplica: ignore`` on the collective's line or on the condition's line.

The results of ``all_reduce``, ``all_gather``, ``broadcast`` and ``merge_call`` are the
same on every replica, so a condition on them is fine: agreeing on a count with a
collective first is the usual fix.

Errors:
    A file that cannot be read or parsed yields one :class:`Finding` (``condition_line``
    is ``None``), so a run over a tree reports it and carries on. A path that does not
    exist raises :class:`FileNotFoundError`.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["COLLECTIVES", "IGNORE_COMMENT", "Finding", "lint_paths", "lint_source"]

COLLECTIVES = frozenset(
    {"all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier", "merge_call"}
)
"""Method names treated as collectives."""

IGNORE_COMMENT = "# asyncreplica: ignore"
"""The comment that silences a finding on the collective's or the condition's line."""

_IGNORE = re.compile(r"#\s*asyncreplica:\s*ignore\b")
_CONTEXT_NAME = re.compile(r"^(ctx|rctx|context|replica_ctx|replica_context|\w+_ctx|\w+_context)$")
_NOT_DATA = re.compile(r"^(self|cls|strategy|\w+_strategy)$")
_MIRRORED_RESULTS = frozenset({"all_reduce", "all_gather", "broadcast", "merge_call", "barrier"})
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})
_MAX_CONDITION = 60

_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
# Statements and expressions that can skip or repeat the code in them.
_BRANCHING = (
    ast.If,
    ast.IfExp,
    ast.BoolOp,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.Match,
    ast.Try,
    ast.comprehension,
    ast.Return,
    ast.Break,
    ast.Continue,
    ast.Raise,
)


@dataclass(frozen=True, order=True)
class Finding:
    """One collective that not every replica may reach.

    Attributes:
        path: The file, as given (or found under a given directory).
        line: The collective's line (1-based).
        col: The collective's column (1-based).
        condition_line: The line of the condition it depends on; ``None`` when the file
            could not be read or parsed.
        message: What is wrong, naming the collective, its line and the condition's line.
    """

    path: str
    line: int
    col: int
    condition_line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.message}"


# The public module to import it from: tracebacks, repr and help() name it, and pickle
# finds it there.
Finding.__module__ = "asyncreplica.lint"


# -- taint -------------------------------------------------------------------------------------

# A source is ("rid", "") for the replica id, ("data", label) for per-replica data, or
# ("param", name) while summarising what a function returns.
_Source = tuple[str, str]
_Taint = frozenset[_Source]
_CLEAN: _Taint = frozenset()
_RID: _Source = ("rid", "")
_RANK: _Source = ("rank", "")
# The process's rank: MPI's Get_rank() and .rank, and the launchers' rank variables.
_RANK_ENV = re.compile(r"^(RANK|LOCAL_RANK|OMPI_COMM_WORLD_RANK|PMI_RANK|PMIX_RANK|SLURM_PROCID)$")
_COMM_NAME = re.compile(r"(^|\.)(comm|world|communicator|COMM_WORLD|\w+_comm)$")


def _describe(taint: _Taint) -> str:
    if _RID in taint:
        return "the replica id"
    if _RANK in taint:
        return "the process rank (each process runs its own replicas)"
    labels = sorted(label for kind, label in taint if kind == "data")
    return f"per-replica data ({', '.join(labels)})" if labels else "per-replica data"


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _callee_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _params(fn: _FunctionNode) -> list[ast.arg]:
    a = fn.args
    out = [*a.posonlyargs, *a.args]
    if a.vararg is not None:
        out.append(a.vararg)
    out.extend(a.kwonlyargs)
    if a.kwarg is not None:
        out.append(a.kwarg)
    return out


_RID_ATTRIBUTE = "replica_id_in_sync_group"


def _reads_replica_id(call: ast.Call) -> bool:
    """``getattr(x, "replica_id_in_sync_group"[, default])``."""
    return (
        isinstance(call.func, ast.Name)
        and call.func.id == "getattr"
        and len(call.args) >= 2
        and isinstance(call.args[1], ast.Constant)
        and call.args[1].value == _RID_ATTRIBUTE
    )


def _is_context_param(arg: ast.arg) -> bool:
    if _CONTEXT_NAME.match(arg.arg) or _NOT_DATA.match(arg.arg):
        return True
    if arg.annotation is not None:
        text = ast.unparse(arg.annotation)
        return "Context" in text or "Strategy" in text
    return False


def _own_nodes(root: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``root`` that is not inside a nested function, class or lambda."""
    stack = list(ast.iter_child_nodes(root))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


@dataclass
class _Summary:
    """What a function of the module returns, in terms of its parameters."""

    fn: _FunctionNode
    is_method: bool
    intrinsic: _Taint = _CLEAN
    flows: frozenset[str] = frozenset()
    collectives: list[ast.Call] = field(default_factory=list)


class _Module:
    """Module-wide facts: functions by name, context names, step and merge functions."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.context_names: set[str] = set()
        self.aliases: dict[str, str] = {}
        self.run_targets: set[str] = set()
        self.merge_fns: set[str] = set()
        self.called: set[str] = set()
        defs: dict[str, list[_FunctionNode]] = {}
        methods: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods.update(
                    id(item)
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                )
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defs.setdefault(node.name, []).append(node)
                self.context_names.update(
                    p.arg
                    for p in _params(node)
                    if p.annotation is not None and "ReplicaContext" in ast.unparse(p.annotation)
                )
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                value = node.value
                if (
                    isinstance(value, ast.Call)
                    and _callee_name(value.func) == "get_replica_context"
                ):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    self.context_names.update(filter(None, map(_dotted, targets)))
            elif isinstance(node, ast.Call):
                self._note_call(node)
        # A name whose replica id is read is a replica context, whatever it is called
        # (``async def helper(c, x): if c.replica_id_in_sync_group: ...``).
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == _RID_ATTRIBUTE:
                receiver = _dotted(node.value)
            elif isinstance(node, ast.Call) and _reads_replica_id(node):
                receiver = _dotted(node.args[0])
            else:
                continue
            if receiver is not None:
                self.context_names.add(receiver)
        # A name bound to a collective (``f = ctx.all_reduce``, or a lambda that calls
        # one): calling it is that collective.
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                continue
            value = node.value
            if isinstance(value, ast.Lambda) and isinstance(value.body, ast.Call):
                method = self.collective_name(value.body)
            elif (
                isinstance(value, ast.Attribute)
                and value.attr in COLLECTIVES
                and self.is_context(value.value)
            ):
                method = value.attr
            else:
                method = None
            if method is not None:
                self.aliases[node.targets[0].id] = method
        # Only names defined once can be resolved without guessing.
        self.functions: dict[str, _Summary] = {
            name: _Summary(fns[0], id(fns[0]) in methods)
            for name, fns in defs.items()
            if len(fns) == 1
        }
        for summary in self.functions.values():
            summary.collectives = [
                n
                for n in _own_nodes(summary.fn)
                if isinstance(n, ast.Call) and self.is_collective(n)
            ]
        for summary in self.functions.values():
            self._summarise(summary)

    def _note_call(self, call: ast.Call) -> None:
        name = _callee_name(call.func)
        if name is not None:
            self.called.add(name)
        if not isinstance(call.func, ast.Attribute):
            return
        first: ast.expr | None = call.args[0] if call.args else None
        for keyword in call.keywords:
            if keyword.arg in ("fn", "merge_fn"):
                first = keyword.value
        if first is None:
            return
        if isinstance(first, ast.Call) and _callee_name(first.func) == "partial" and first.args:
            first = first.args[0]
        target = _callee_name(first)
        if target is None:
            return
        if call.func.attr == "run":
            self.run_targets.add(target)
        elif call.func.attr == "merge_call":
            self.merge_fns.add(target)

    def is_context(self, node: ast.expr) -> bool:
        """Whether ``node`` looks like a replica context."""
        if isinstance(node, ast.Call):
            return _callee_name(node.func) == "get_replica_context"
        dotted = _dotted(node)
        if dotted is None:
            return False
        return dotted in self.context_names or bool(_CONTEXT_NAME.match(dotted.rsplit(".", 1)[-1]))

    def is_collective(self, call: ast.Call) -> bool:
        """Whether ``call`` is a collective: a collective's name on a context-like receiver.

        ``<...>.extended.update(var, fn)`` is one too: in replica context it goes
        through ``merge_call``, so every replica must make it. So is a call of a name
        bound to a collective (``f = ctx.all_reduce``, ``f = lambda: ctx.all_reduce(...)``).
        """
        return self.collective_name(call) is not None

    def collective_name(self, call: ast.Call) -> str | None:
        """The collective ``call`` makes (``"all_reduce"``), or None when it makes none."""
        func = call.func
        if isinstance(func, ast.Name):
            return self.aliases.get(func.id)
        if not isinstance(func, ast.Attribute):
            return None
        if func.attr == "update":
            extended = isinstance(func.value, ast.Attribute) and func.value.attr == "extended"
            return "update" if extended else None
        return func.attr if func.attr in COLLECTIVES and self.is_context(func.value) else None

    def makes_collectives(self, fn: _FunctionNode) -> bool:
        """Whether ``fn`` itself (not a nested function) calls a collective or a helper that does."""
        return any(
            isinstance(node, ast.Call)
            and (self.is_collective(node) or bool(self.helper_collectives(node)))
            for node in _own_nodes(fn)
        )

    def resolve(self, call: ast.Call) -> _Summary | None:
        """The function of this module that ``call`` calls, when it is unambiguous."""
        func = call.func
        if isinstance(func, ast.Name):
            summary = self.functions.get(func.id)
            return summary if summary is not None and not summary.is_method else None
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls")
        ):
            summary = self.functions.get(func.attr)
            return summary if summary is not None and summary.is_method else None
        return None

    def helper_collectives(self, call: ast.Call) -> list[ast.Call]:
        """The collectives a call of a same-module function makes (one level deep)."""
        summary = self.resolve(call)
        if summary is None or summary.fn.name in self.merge_fns:
            return []
        return summary.collectives

    def _summarise(self, summary: _Summary) -> None:
        env: dict[str, _Taint] = {p.arg: frozenset({("param", p.arg)}) for p in _params(summary.fn)}
        taints = _Taints(self, env, use_summaries=False)
        taints.settle(summary.fn)
        result = _CLEAN
        for node in _own_nodes(summary.fn):
            if isinstance(node, ast.Return) and node.value is not None:
                result |= taints.of(node.value)
        summary.intrinsic = frozenset(s for s in result if s[0] != "param")
        summary.flows = frozenset(label for kind, label in result if kind == "param")

    def bind(
        self, summary: _Summary, call: ast.Call, taint_of: Callable[[ast.expr], _Taint]
    ) -> dict[str, _Taint]:
        """The taint each parameter of ``summary.fn`` gets from the arguments of ``call``."""
        fn = summary.fn
        positional = [*fn.args.posonlyargs, *fn.args.args]
        if summary.is_method and positional:
            positional = positional[1:]
        bound: dict[str, _Taint] = {}
        extra = _CLEAN
        for i, arg in enumerate(call.args):
            t = taint_of(arg)
            if isinstance(arg, ast.Starred) or i >= len(positional):
                extra |= t
            else:
                bound[positional[i].arg] = bound.get(positional[i].arg, _CLEAN) | t
        for keyword in call.keywords:
            t = taint_of(keyword.value)
            if keyword.arg is None:
                extra |= t
            else:
                bound[keyword.arg] = bound.get(keyword.arg, _CLEAN) | t
        if extra:
            for p in _params(fn):
                bound[p.arg] = bound.get(p.arg, _CLEAN) | extra
        return bound


class _Taints:
    """The (flow-insensitive) taint of the names of one function body."""

    def __init__(self, module: _Module, env: dict[str, _Taint], *, use_summaries: bool) -> None:
        self.module = module
        self.env = env
        self.use_summaries = use_summaries

    def __call__(self, node: ast.expr) -> _Taint:
        return self.of(node)

    def settle(self, root: ast.AST) -> None:
        """Propagate taint through the assignments under ``root`` until nothing changes."""
        flows: list[tuple[ast.expr, ast.expr, bool]] = []  # (target, value, augmented)
        for node in _own_nodes(root):
            if isinstance(node, ast.Assign):
                flows.extend((target, node.value, False) for target in node.targets)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                flows.append((node.target, node.value, False))
            elif isinstance(node, ast.AugAssign):
                flows.append((node.target, node.value, True))
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                flows.append((node.target, node.iter, False))
            elif isinstance(node, ast.NamedExpr):
                flows.append((node.target, node.value, False))
            elif isinstance(node, ast.With | ast.AsyncWith):
                flows.extend(
                    (item.optional_vars, item.context_expr, False)
                    for item in node.items
                    if item.optional_vars is not None
                )
        for _ in range(50):
            changed = False
            for target, value, _augmented in flows:
                taint = self.of(value)
                if taint:
                    for key in _target_keys(target):
                        old = self.env.get(key, _CLEAN)
                        if not taint <= old:
                            self.env[key] = old | taint
                            changed = True
            if not changed:
                break

    def of(self, node: ast.expr) -> _Taint:
        """The sources ``node`` depends on."""
        if isinstance(node, ast.Name):
            return self.env.get(node.id, _CLEAN)
        if isinstance(node, ast.Attribute):
            if node.attr == "replica_id_in_sync_group":
                return frozenset({_RID})
            if _is_rank_attribute(node):
                return frozenset({_RANK})
            dotted = _dotted(node)
            own = self.env.get(dotted, _CLEAN) if dotted is not None else _CLEAN
            return own | self.of(node.value)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Lambda):
            return _CLEAN
        if isinstance(node, ast.Subscript) and _names_rank_variable(node.slice):
            return frozenset({_RANK})  # os.environ["RANK"]
        result = _CLEAN
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                result |= self.of(child)
            elif isinstance(child, ast.comprehension):
                result |= self.of(child.iter)
                for test in child.ifs:
                    result |= self.of(test)
            elif isinstance(child, ast.keyword):
                result |= self.of(child.value)
        return result

    def _call(self, call: ast.Call) -> _Taint:
        func = call.func
        if _callee_name(func) == "get_replica_context":
            return _CLEAN
        if _callee_name(func) in ("Get_rank", "get_rank"):  # MPI, torch.distributed
            return frozenset({_RANK})
        if _callee_name(func) in ("get", "getenv") and any(
            _names_rank_variable(a) for a in call.args[:1]
        ):
            return frozenset({_RANK})  # os.environ.get("RANK"), os.getenv("RANK")
        if _reads_replica_id(call):
            return frozenset({_RID})  # getattr(ctx, "replica_id_in_sync_group")
        method = self.module.collective_name(call)
        if method is not None:
            if method in _MIRRORED_RESULTS:
                return _CLEAN
            return frozenset({("data", f"the result of {method}")})
        if self.use_summaries:
            summary = self.module.resolve(call)
            if summary is not None:
                bound = self.module.bind(summary, call, self)
                result = summary.intrinsic
                for name in summary.flows:
                    result |= bound.get(name, _CLEAN)
                return result
        result = self.of(func)
        for arg in call.args:
            result |= self.of(arg)
        for keyword in call.keywords:
            result |= self.of(keyword.value)
        return result


def _is_rank_attribute(node: ast.Attribute) -> bool:
    """``comm.rank``, ``MPI.COMM_WORLD.rank`` or ``cluster_resolver.task_id``."""
    base = _dotted(node.value)
    if base is None:
        return False
    if node.attr == "rank":
        return _COMM_NAME.search(base) is not None
    return node.attr == "task_id" and base.endswith("cluster_resolver")


def _names_rank_variable(node: ast.expr) -> bool:
    """A string constant naming a launcher's rank variable (``"RANK"``, ``"PMI_RANK"``)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _RANK_ENV.match(node.value) is not None
    )


def _target_keys(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_keys(element)
    elif isinstance(target, ast.Starred | ast.Subscript):
        yield from _target_keys(target.value)
    else:
        dotted = _dotted(target)
        if dotted is not None:
            yield dotted


# -- guards ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Guard:
    """A condition a collective depends on, and how."""

    line: int
    lines: range  # the lines of the condition, where an ignore comment may sit
    taint: _Taint
    phrase: str  # e.g. "runs only when `x == 0` (line 3) is true"


def _text(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= _MAX_CONDITION else text[: _MAX_CONDITION - 3] + "..."


def _lines(node: ast.AST) -> range:
    start = getattr(node, "lineno", 0)
    return range(start, (getattr(node, "end_lineno", None) or start) + 1)


def _when(test: ast.expr, truth: bool) -> str:
    return f"runs only when `{_text(test)}` (line {test.lineno}) is {'true' if truth else 'false'}"


def _start(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _end(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


def _inside(node: ast.AST, outer: ast.AST) -> bool:
    return _start(outer) <= _start(node) and _end(node) <= _end(outer)


@dataclass(frozen=True)
class _Exit:
    """An early ``return``/``break``/``continue`` under a per-replica condition.

    Or a ``raise`` there that a ``try``/``except`` or ``contextlib.suppress`` around it
    catches: the replica goes on after the ``try`` or ``with``, skipping the rest of it.
    """

    guard: ast.stmt  # the `if` (or `match`) statement
    stmt: ast.stmt  # the exit itself
    loop: ast.For | ast.AsyncFor | ast.While | None
    taint: _Taint
    phrase: str
    lines: range
    line: int
    # A `raise`: the `try` (with handlers) or `with contextlib.suppress(...)` that
    # catches it, whose body after the raise is skipped.
    catcher: ast.Try | ast.TryStar | ast.With | ast.AsyncWith | None = None


@dataclass
class _Site:
    call: ast.Call
    guards: list[_Guard]


class _FunctionCheck:
    """Collect the collectives of one scope with the per-replica conditions around them."""

    def __init__(self, module: _Module, taints: _Taints) -> None:
        self.module = module
        self.taints = taints
        self.sites: list[_Site] = []
        self.exits: list[_Exit] = []
        self.loops: list[ast.For | ast.AsyncFor | ast.While] = []
        # The `try` statements with handlers and `with suppress(...)` around a statement.
        self.catchers: list[ast.Try | ast.TryStar | ast.With | ast.AsyncWith] = []

    def _guard(self, test: ast.expr, phrase: str) -> _Guard | None:
        taint = self.taints.of(test)
        if not taint:
            return None
        return _Guard(test.lineno, _lines(test), taint, phrase)

    def stmts(self, body: Iterable[ast.stmt], guards: list[_Guard]) -> None:
        for stmt in body:
            self.stmt(stmt, guards)

    def stmt(self, node: ast.stmt, guards: list[_Guard]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(node, ast.If):
            self.expr(node.test, guards)
            # Both branches issue the same named collectives (in any order, e.g. started
            # as tasks): every replica reaches each name, and names pair by name.
            named = self._named_collectives(node.body)
            balanced = bool(named) and named == self._named_collectives(node.orelse)
            for body, truth in ((node.body, True), (node.orelse, False)):
                guard = None if balanced else self._guard(node.test, _when(node.test, truth))
                inner = [*guards, guard] if guard else guards
                if guard is not None:
                    self._find_exits(node, body, guard)
                self.stmts(body, inner)
            return
        if isinstance(node, ast.While):
            self.expr(node.test, guards)
            guard = self._guard(
                node.test, f"runs while `{_text(node.test)}` (line {node.test.lineno}) is true"
            )
            self.loops.append(node)
            self.stmts(node.body, [*guards, guard] if guard else guards)
            self.loops.pop()
            self.stmts(node.orelse, guards)
            return
        if isinstance(node, ast.For | ast.AsyncFor):
            self.expr(node.iter, guards)
            guard = self._guard(
                node.iter,
                f"runs once per item of `{_text(node.iter)}` (line {node.iter.lineno}), "
                "whose length can differ between replicas",
            )
            self.loops.append(node)
            self.stmts(node.body, [*guards, guard] if guard else guards)
            self.loops.pop()
            self.stmts(node.orelse, guards)
            return
        if isinstance(node, ast.Try | ast.TryStar) and node.handlers:
            self.catchers.append(node)
            self.stmts(node.body, guards)
            self.catchers.pop()
            for handler in node.handlers:
                if handler.type is not None:
                    self.expr(handler.type, guards)
                self.stmts(handler.body, guards)
            self.stmts(node.orelse, guards)
            self.stmts(node.finalbody, guards)
            return
        if isinstance(node, ast.With | ast.AsyncWith) and any(
            isinstance(item.context_expr, ast.Call)
            and _callee_name(item.context_expr.func) == "suppress"
            for item in node.items
        ):
            for item in node.items:
                self.expr(item.context_expr, guards)
            self.catchers.append(node)
            self.stmts(node.body, guards)
            self.catchers.pop()
            return
        if isinstance(node, ast.Match):
            self.expr(node.subject, guards)
            for case in node.cases:
                inner = list(guards)
                pattern = _text(case.pattern)
                subject = self._guard(
                    node.subject,
                    f"runs only when `{_text(node.subject)}` (line {node.subject.lineno}) "
                    f"matches `case {pattern}`",
                )
                if subject is not None:
                    inner.append(subject)
                    self._find_exits(node, case.body, subject)
                if case.guard is not None:
                    self.expr(case.guard, inner)
                    guard = self._guard(case.guard, _when(case.guard, True))
                    if guard is not None:
                        inner.append(guard)
                        self._find_exits(node, case.body, guard)
                self.stmts(case.body, inner)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, guards)
            elif isinstance(child, ast.stmt):
                self.stmt(child, guards)
            elif isinstance(child, ast.ExceptHandler | ast.match_case | ast.withitem):
                for grand in ast.iter_child_nodes(child):
                    if isinstance(grand, ast.expr):
                        self.expr(grand, guards)
                    elif isinstance(grand, ast.stmt):
                        self.stmt(grand, guards)

    def _named_collectives(self, body: list[ast.stmt]) -> Counter[tuple[str, str]] | None:
        """``(method, name)`` of each collective of a straight-line ``body``, or None.

        None unless every collective in ``body`` is a direct call with a literal
        ``name=`` and ``body`` has no loop, branch or exit that could skip or repeat one.
        """
        found: Counter[tuple[str, str]] = Counter()
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            if isinstance(node, _BRANCHING):
                return None
            if isinstance(node, ast.Call):
                method = self.module.collective_name(node)
                if method is not None:
                    name = next((k.value for k in node.keywords if k.arg == "name"), None)
                    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                        return None
                    found[(method, name.value)] += 1
                elif self.module.helper_collectives(node):
                    return None
            stack.extend(ast.iter_child_nodes(node))
        return found

    def _find_exits(self, owner: ast.stmt, body: list[ast.stmt], guard: _Guard) -> None:
        """Record the exits in ``body`` (taken when ``guard`` holds) that skip later code."""
        loop = self.loops[-1] if self.loops else None
        catcher = self.catchers[-1] if self.catchers else None
        # A raise in a try of the branch itself is caught there, not by `catcher`.
        caught = {
            id(inner)
            for stmt in body
            for node in ast.walk(stmt)
            if isinstance(node, ast.Try | ast.TryStar) and node.handlers
            for inner in ast.walk(ast.Module(body=node.body, type_ignores=[]))
            if isinstance(inner, ast.Raise)
        }
        stack: list[tuple[ast.AST, bool]] = [(s, False) for s in body]
        while stack:
            node, in_loop = stack.pop()
            if (
                isinstance(node, ast.Raise)
                and catcher is not None
                and not in_loop
                and id(node) not in caught
            ):
                self.exits.append(
                    _Exit(
                        owner,
                        node,
                        None,
                        guard.taint,
                        guard.phrase,
                        guard.lines,
                        guard.line,
                        catcher,
                    )
                )
            if isinstance(node, ast.Return) or (
                isinstance(node, ast.Break | ast.Continue) and not in_loop and loop is not None
            ):
                assert isinstance(node, ast.stmt)
                self.exits.append(
                    _Exit(
                        owner,
                        node,
                        loop,
                        guard.taint,
                        guard.phrase,
                        guard.lines,
                        guard.line,
                    )
                )
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            nested = in_loop or isinstance(node, ast.For | ast.AsyncFor | ast.While)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt | ast.ExceptHandler | ast.match_case):
                    stack.append((child, nested))

    def expr(self, node: ast.expr, guards: list[_Guard]) -> None:
        """Find the collectives in ``node`` with the conditions around them."""
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call) and (
            self.module.is_collective(node) or self.module.helper_collectives(node)
        ):
            self.sites.append(_Site(node, list(guards)))
        if isinstance(node, ast.IfExp):
            self.expr(node.test, guards)
            for branch, truth in ((node.body, True), (node.orelse, False)):
                guard = self._guard(node.test, _when(node.test, truth))
                self.expr(branch, [*guards, guard] if guard else guards)
            return
        if isinstance(node, ast.BoolOp):
            inner = list(guards)
            for value in node.values:
                self.expr(value, inner)
                guard = self._guard(value, _when(value, isinstance(node.op, ast.And)))
                if guard is not None:
                    inner.append(guard)
            return
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            inner = list(guards)
            for generator in node.generators:
                self.expr(generator.iter, inner)
                guard = self._guard(
                    generator.iter,
                    f"runs once per item of `{_text(generator.iter)}` "
                    f"(line {generator.iter.lineno}), whose length can differ between replicas",
                )
                if guard is not None:
                    inner.append(guard)
                for test in generator.ifs:
                    self.expr(test, inner)
                    guard = self._guard(test, _when(test, True))
                    if guard is not None:
                        inner.append(guard)
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for element in elements:
                self.expr(element, inner)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, guards)
            elif isinstance(child, ast.keyword):
                self.expr(child.value, guards)

    def exit_guards(self, call: ast.Call) -> list[_Guard]:
        """The early exits that can skip ``call``, closest first."""
        found: list[tuple[tuple[int, int], _Guard]] = []
        for ex in self.exits:
            after = _start(call) >= _end(ex.guard)
            in_loop = ex.loop is not None and _inside(call, ex.loop)
            if ex.catcher is not None:
                # Skipped: the rest of the try's body, or of the with's (a raise nested
                # in a loop or another try of the branch is not followed: in_loop).
                skips = after and any(_inside(call, stmt) for stmt in ex.catcher.body)
                how = (
                    f"the replica raises at line {ex.stmt.lineno}, caught by the "
                    f"{'with' if isinstance(ex.catcher, ast.With | ast.AsyncWith) else 'try'} "
                    f"at line {ex.catcher.lineno}"
                )
            elif isinstance(ex.stmt, ast.Return):
                skips = after or in_loop
                how = f"the replica returns at line {ex.stmt.lineno}"
            elif isinstance(ex.stmt, ast.Break):
                skips = in_loop and not _inside(call, ex.guard)
                how = f"the loop ends at line {ex.stmt.lineno}"
            else:
                skips = in_loop and after
                how = f"the iteration ends at line {ex.stmt.lineno}"
            if not skips or _inside(call, ex.guard):
                continue
            condition = ex.phrase.replace("runs only when", "is skipped when", 1)
            found.append(
                (_end(ex.guard), _Guard(ex.line, ex.lines, ex.taint, f"{condition} ({how})"))
            )
        found.sort(key=lambda item: item[0], reverse=True)
        return [guard for _, guard in found]


# -- the check ---------------------------------------------------------------------------------


def _ignored_lines(source: str) -> set[int]:
    lines: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and _IGNORE.search(token.string):
                lines.add(token.start[0])
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - parsed fine by ast already
        lines = {n for n, text in enumerate(source.splitlines(), 1) if _IGNORE.search(text)}
    return lines


def _initial_env(
    fn: _FunctionNode,
    outer: dict[str, _Taint],
    callers: dict[str, _Taint] | None,
    *,
    step: bool,
    contexts: set[str],
) -> dict[str, _Taint]:
    env = dict(outer)
    for param in _params(fn):
        env.pop(param.arg, None)
        if _is_context_param(param) or param.arg in contexts or not step:
            continue
        if callers is None:
            env[param.arg] = frozenset({("data", f"`{param.arg}`")})
        elif callers.get(param.arg):
            env[param.arg] = callers[param.arg]
    return env


class _Checker:
    def __init__(self, source: str, path: str, tree: ast.Module) -> None:
        self.source = source
        self.path = path
        self.module = _Module(tree)
        self.ignored = _ignored_lines(source)
        self.findings: list[Finding] = []
        # Taint that the callers in this module pass to each function's parameters.
        self.passed: dict[str, dict[str, _Taint]] = {}

    def run(self) -> list[Finding]:
        tree = self.module.tree
        # First pass, every parameter per-replica: what each function passes to the
        # functions of this module it calls. Second pass: the check, with that knowledge.
        self._scope(tree, {}, report=False)
        self._scope(tree, {}, report=True)
        return sorted(set(self.findings))

    def _callers(self, fn: _FunctionNode, *, report: bool) -> dict[str, _Taint] | None:
        """What this module's callers pass to ``fn``, or ``None``: all parameters per-replica."""
        if not report or fn.name in self.module.run_targets:
            return None
        summary = self.module.functions.get(fn.name)
        if summary is None or summary.fn is not fn:
            return None
        return self.passed.get(fn.name)

    def _scope(
        self, root: ast.Module | _FunctionNode, outer: dict[str, _Taint], *, report: bool
    ) -> None:
        if isinstance(root, ast.Module):
            env: dict[str, _Taint] = {}
        else:
            step = root.name in self.module.run_targets or self.module.makes_collectives(root)
            env = _initial_env(
                root,
                outer,
                self._callers(root, report=report),
                step=step,
                contexts=self.module.context_names,
            )
        taints = _Taints(self.module, env, use_summaries=True)
        taints.settle(root)
        if not report:
            for node in _own_nodes(root):
                if isinstance(node, ast.Call):
                    summary = self.module.resolve(node)
                    if summary is not None:
                        bound = self.module.bind(summary, node, taints)
                        passed = self.passed.setdefault(summary.fn.name, {})
                        for name, taint in bound.items():
                            passed[name] = passed.get(name, _CLEAN) | taint
        merge_fn = not isinstance(root, ast.Module) and root.name in self.module.merge_fns
        if report and not merge_fn:
            check = _FunctionCheck(self.module, taints)
            check.stmts(root.body, [])
            for site in check.sites:
                self._report(site, check)
        for node in _own_nodes(root):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self._scope(node, dict(env), report=report)
            elif isinstance(node, ast.ClassDef):
                self._class(node, report=report)

    def _class(self, node: ast.ClassDef, *, report: bool) -> None:
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                self._scope(item, {}, report=report)
            elif isinstance(item, ast.ClassDef):
                self._class(item, report=report)

    def _report(self, site: _Site, check: _FunctionCheck) -> None:
        call = site.call
        if self.ignored.intersection(_lines(call)):
            return
        structural = [g for g in site.guards if not self.ignored.intersection(g.lines)]
        exits = [g for g in check.exit_guards(call) if not self.ignored.intersection(g.lines)]
        if structural:
            guard = structural[-1]
        elif exits:
            guard = exits[0]
        else:
            return
        assert isinstance(call.func, ast.Attribute | ast.Name)
        callee = _callee_name(call.func) or "collective"
        method = self.module.collective_name(call)
        if method is not None and method != callee:
            callee = f"{method} (called as `{callee}`)"
        what = f"{callee} at line {call.lineno}"
        helper = self.module.helper_collectives(call)
        if helper and not self.module.is_collective(call):
            inner = helper[0]
            inner_name = _callee_name(inner.func) or "collective"
            what = f"{what.replace(' at', '() at', 1)} (which calls {inner_name} at line {inner.lineno})"
        message = (
            f"{what} {guard.phrase}; a collective every replica must "
            f"reach cannot depend on {_describe(guard.taint)}"
        )
        self.findings.append(
            Finding(self.path, call.lineno, call.col_offset + 1, guard.line, message)
        )


def lint_source(source: str, path: str = "<string>") -> list[Finding]:
    """Check the Python source ``source`` for collectives that not every replica reaches.

    Args:
        source: The module's text.
        path: The name findings carry.

    Returns:
        The findings, ordered by line and column. A syntax error gives one finding at its
        position whose ``condition_line`` is ``None``.
    """
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 1
        col = exc.offset or 1
        return [Finding(path, line, col, None, f"cannot parse: {exc.msg}")]
    except ValueError as exc:  # e.g. null bytes in the source
        return [Finding(path, 1, 1, None, f"cannot parse: {exc}")]
    return _Checker(source, path, tree).run()


def _walk(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root, name)


def lint_paths(paths: Sequence[str]) -> list[Finding]:
    """Check files, and the ``*.py`` files under directories, for unreachable collectives.

    Directories are walked recursively, skipping hidden directories (``.git``, ``.venv``)
    and ``__pycache__``. A file named explicitly is checked whatever its suffix.

    Args:
        paths: Files and directories.

    Returns:
        The findings of every file, ordered by path, line and column. A file that cannot
        be read or decoded, or does not parse, gives one finding whose ``condition_line``
        is ``None``.

    Raises:
        FileNotFoundError: A path does not exist.
    """
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files.extend(_walk(path))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"asyncreplica lint: no such file or directory: {name}")
    findings: list[Finding] = []
    for file in files:
        shown = str(file)
        try:
            with tokenize.open(file) as handle:  # honours PEP 263 encoding declarations
                source = handle.read()
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            findings.append(Finding(shown, 1, 1, None, f"cannot read: {reason}"))
            continue
        findings.extend(lint_source(source, shown))
    return sorted(findings, key=lambda f: (f.path, f.line, f.col))
