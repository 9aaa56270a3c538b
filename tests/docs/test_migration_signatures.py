"""The signatures docs/migration.md shows are the code's (``inspect.signature``).

Every call written in the asyncreplica column of the API tables, such as
``ar.MirroredStrategy(devices=None, *, backend=None, ...)`` or
``await ctx.all_reduce(reduce_op, value, options=None, *, name=None)``, must list the same
parameters, in the same order and kind (positional or keyword-only), with the same
defaults, as the object it names. ``(...)`` means "the same arguments" and is not
compared.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import asyncreplica as ar

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
OWNERS: dict[str, Any] = {
    "ar": ar,
    "ctx": ar.ReplicaContext,
    "strategy": ar.MirroredStrategy,
    "extended": ar.StrategyExtended,
}
CALL = re.compile(r"`(?:await )?(ar|ctx|strategy|extended)\.([A-Za-z_.]+)\(([^`]*)\)`")


def _documented() -> list[tuple[str, str, str]]:
    """``(owner, dotted name, parameters)`` of every call in an asyncreplica column."""
    calls = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or len(cells) < 3:
            continue
        for owner, name, params in CALL.findall(cells[1]):
            if params.strip() != "...":
                calls.append((owner, name, params))
    return calls


DOCUMENTED = _documented()


def _resolve(owner: str, name: str) -> Any:
    obj = OWNERS[owner]
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _shape_of_docs(params: str) -> list[tuple[str, str, object]]:
    """``(name, kind, default)`` of the parameters as written, parsed as a def."""
    args = ast.parse(f"def f({params}): pass").body[0].args  # type: ignore[attr-defined]
    shape: list[tuple[str, str, object]] = []
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    for arg, default in zip(positional, defaults, strict=True):
        shape.append((arg.arg, "positional", default))
    if args.vararg is not None:
        shape.append((args.vararg.arg, "*args", inspect.Parameter.empty))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = inspect.Parameter.empty if kw_default is None else ast.literal_eval(kw_default)
        shape.append((arg.arg, "keyword", value))
    if args.kwarg is not None:
        shape.append((args.kwarg.arg, "**kwargs", inspect.Parameter.empty))
    return shape


def _shape_of_code(obj: Any) -> list[tuple[str, str, object]]:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_POSITIONAL: "*args",
        inspect.Parameter.VAR_KEYWORD: "**kwargs",
    }
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, kinds[p.kind], p.default) for p in params]


def test_the_page_shows_signatures() -> None:
    names = {name for _, name, _ in DOCUMENTED}
    assert {"MirroredStrategy", "MultiWorkerMirroredStrategy", "all_reduce", "run"} <= names


@pytest.mark.parametrize(
    ("owner", "name", "params"), DOCUMENTED, ids=[f"{o}.{n}" for o, n, _ in DOCUMENTED]
)
def test_documented_signature_is_the_codes(owner: str, name: str, params: str) -> None:
    documented = _shape_of_docs(params)
    actual = _shape_of_code(_resolve(owner, name))
    assert documented == actual, (
        f"docs/migration.md shows {owner}.{name}({params}); the code is "
        f"{name}{inspect.signature(_resolve(owner, name))}"
    )
