"""How a replica's task ended: the lifecycle event the runtime reports to the table.

:mod:`asyncreplica._core._lifecycle` holds the table of the replica lifecycle; it cannot
look at tasks, cancel scopes or tracebacks. This module can, and turns what ended a
replica's task into one :class:`~asyncreplica._core._lifecycle.Event`:

* a cancellation (``asyncio.CancelledError`` on any loop, or the loop's own cancellation
  class) is ``CANCEL`` when a cancel scope effective for the replica's task asked for it
  (the run's own scope, cancelled because the run failed, or any scope around
  ``Strategy.run``), else ``CANCEL_OUTSIDE`` (``task.cancel()`` on the replica's task, or
  a ``CancelledError`` raised by a library);
* ``GeneratorExit`` is ``CLOSE``;
* an ``Exception`` is ``BUG`` when asyncreplica's own code raised it by mistake (see
  :func:`raised_by_library`), else ``RAISE``;
* any other ``BaseException`` (``KeyboardInterrupt``, ``SystemExit``, the user's own) is
  ``INTERRUPT``.

Telling the library's bugs from the user's errors, by the traceback's innermost frame:
an error is asyncreplica's own when that frame is in asyncreplica (or one of its
built-in backends, ``asyncreplica_*``) and that frame did not mean to raise it. Errors
the library raises on purpose (every ``AsyncReplicaError``; the ``TypeError`` and
``ValueError`` of argument checks) come from a ``raise`` statement; a bug is the
interpreter or a C function failing under the library's line (an ``AttributeError`` on
``None``, a ``KeyError``, numpy's own errors) or a failed ``assert``. An error whose
innermost frame is the user's (the step function, a merge_fn, the user's value's
methods) is the user's, even when library code called that frame.
"""

from __future__ import annotations

import asyncio
import dis
import functools
import inspect
import math
from types import FrameType, TracebackType

import anyio

from .._core._lifecycle import Event
from .._exceptions import AsyncReplicaError
from ._tasks import _internal, _short

__all__ = [
    "cancellation",
    "delivered_by",
    "event_of",
    "raised_by_library",
    "raised_in_library",
    "requested",
    "scope_cancellation",
    "where_ended",
]

# Instructions that mean "this frame raises on purpose" (a raise statement, a re-raise).
_RAISES = frozenset(dis.opmap[name] for name in ("RAISE_VARARGS", "RERAISE") if name in dis.opmap)
# Instructions where an exception arrives from an awaited object, not from the line.
_AWAITS = frozenset(
    dis.opmap[name]
    for name in (
        "SEND",
        "YIELD_VALUE",
        "GET_AWAITABLE",
        "RESUME",
        "END_SEND",
        "CLEANUP_THROW",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "GET_ANEXT",
        "END_ASYNC_FOR",
        "BEFORE_ASYNC_WITH",
        "RETURN_GENERATOR",
    )
    if name in dis.opmap
)
# What the library raises on purpose, when a frame's instructions cannot be read (a
# module compiled with mypyc has no bytecode to look at): argument checks, and the
# RuntimeError of a collective awaited twice (as Python's own coroutines say it).
_DELIBERATE = (AsyncReplicaError, TypeError, ValueError, NotImplementedError, RuntimeError)


# The machine running out of something (memory, file handles, disk) while the library
# works on the user's values: the user's values asked for it, never a bug of ours (an
# all_reduce of a 32 TiB broadcast view raised numpy's MemoryError in the backend).
_EXHAUSTION = (MemoryError, OSError)

# numpy raises FloatingPointError only where the user's np.seterr/np.errstate asked for
# it ("raise"): the user's error wherever the library combined the values, on every path.
# A warning raised as an exception is the user's warnings filter's "error" action
# (``python -W error``, pytest's ``filterwarnings = error``): numpy's RuntimeWarning of a
# combine is the user's, as it is when the filter only prints it.
_ASKED = (FloatingPointError, Warning)


def _own(frame: FrameType) -> bool:
    """Whether ``frame`` runs asyncreplica's own code (by its module, never by a path)."""
    name = frame.f_globals.get("__name__")
    if not isinstance(name, str):
        return False
    top = name.partition(".")[0]
    return top == "asyncreplica" or top.startswith("asyncreplica_")


def _innermost(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def raised_in_library(error: BaseException) -> bool:
    """Whether ``error``'s innermost frame is asyncreplica's own (not the user's ``raise``)."""
    tb = _innermost(error.__traceback__)
    return tb is not None and _own(tb.tb_frame)


def raised_by_library(error: BaseException) -> bool:
    """Whether ``error`` is a bug of asyncreplica's rather than an error of the user's.

    See the module docstring for the rule. ``AsyncReplicaError`` (raised on purpose) and
    exception groups (the user's task groups) are never bugs here.
    """
    if isinstance(error, (AsyncReplicaError, BaseExceptionGroup, *_ASKED, *_EXHAUSTION)):
        return False
    tb = _innermost(error.__traceback__)
    if tb is None or not _own(tb.tb_frame):
        return False
    if isinstance(error, AssertionError):
        return True  # a broken assert of the library's
    source = tb.tb_frame.f_globals.get("__file__")
    code = tb.tb_frame.f_code.co_code
    lasti = tb.tb_lasti
    if not (isinstance(source, str) and source.endswith((".py", ".pyc"))) or not (
        0 <= lasti < len(code)
    ):
        # A module compiled with mypyc: its traceback entries carry a stand-in code
        # object, with no instruction to look at. Judge by the type alone.
        return not isinstance(error, _DELIBERATE)
    op = code[lasti]
    return op not in _RAISES and op not in _AWAITS


def requested() -> bool:
    """Whether a cancel scope effective for the current task has been cancelled.

    Called in a replica's task where it ends, outside any scope of the user's: then the
    scopes effective for it are the run's own and those around ``Strategy.run``.
    """
    deadline = anyio.current_effective_deadline()
    return deadline == -math.inf or deadline <= anyio.current_time()


def cancellation(error: BaseException) -> bool:
    """Whether ``error`` is a cancellation: asyncio's on any loop, or the loop's own."""
    return isinstance(error, (asyncio.CancelledError, anyio.get_cancelled_exc_class()))


def _message(error: BaseException) -> str:
    args = error.args
    return args[0] if args and isinstance(args[0], str) else ""


def scope_cancellation(error: BaseException) -> bool:
    """Whether the cancellation ``error`` was delivered by a cancel scope.

    Not by ``task.cancel()`` (asyncio), nor raised by code. On asyncio, anyio's scopes
    cancel a task with a message naming the scope ("Cancelled via cancel scope 7f...");
    a trio ``Cancelled`` only ever comes from a scope. (tests/runtime/
    test_endings_third_round.py fails the day anyio's message changes.)
    """
    if not isinstance(error, asyncio.CancelledError):
        return cancellation(error)  # the loop's own class: trio's Cancelled
    return "cancel scope" in _message(error)


def delivered_by(error: BaseException, scope: object, reason: str | None) -> bool | None:
    """Whether the cancellation ``error`` came from ``scope``, cancelled with ``reason``.

    A task cancelled by two scopes in one turn raises the cancellation of the first one
    only: this says which. On asyncio anyio's message names the scope; on trio the
    exception carries the scope's ``reason`` (trio 0.31 and anyio 4.11 and later).

    Returns:
        None when it cannot be told (an older trio or anyio).
    """
    if isinstance(error, asyncio.CancelledError):
        return f"cancel scope {id(scope):x}" in _message(error)
    if reason is None or not hasattr(error, "reason"):
        return None
    return bool(getattr(error, "reason", None) == reason)


def event_of(error: BaseException) -> Event:
    """The lifecycle event of a replica's task that ended with ``error``.

    Call it in that task, where the error left the step function (see :func:`requested`).
    """
    if cancellation(error):
        return Event.CANCEL if requested() else Event.CANCEL_OUTSIDE
    if isinstance(error, GeneratorExit):
        return Event.CLOSE
    if isinstance(error, Exception):
        return Event.BUG if raised_by_library(error) else Event.RAISE
    return Event.INTERRUPT


def where_ended(error: BaseException) -> str | None:
    """Where ``error`` left the user's code: ``file:line in function()``, or None.

    The innermost frame of the traceback that is neither asyncreplica's nor an event
    loop's: the line of the step function (or merge_fn) it passed last.
    """
    found = None
    tb = error.__traceback__
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename) and not _own(tb.tb_frame):
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    code = found.tb_frame.f_code
    return f"{_short(code.co_filename)}:{found.tb_lineno} in {code.co_name}()"


def stop_iteration_error(error: StopIteration, what: str) -> RuntimeError:
    """The ``RuntimeError`` a ``StopIteration`` from ``what`` becomes, made where it is caught.

    A ``StopIteration`` cannot leave a coroutine (PEP 479): Python replaces it with
    ``RuntimeError("coroutine raised StopIteration")`` at the frame it leaves, which is
    asyncreplica's, after the run noted where it came from. Made here, the note goes on
    the error the user sees.
    """
    runtime = RuntimeError(
        f"{what} raised StopIteration, which cannot leave a coroutine (PEP 479): it is "
        "raised as this RuntimeError (a next() on an exhausted iterator? use "
        "next(it, default) or catch StopIteration)"
    )
    runtime.__cause__ = error
    return runtime


def generator_step(fn: object) -> bool:
    """Whether calling ``fn`` gives a generator that is not a coroutine (a stray ``yield``).

    A ``@types.coroutine`` generator function is a coroutine: awaiting what it returns
    runs it, so it is a step like any ``async def``.
    """
    if inspect.isasyncgenfunction(fn):
        return True
    if not inspect.isgeneratorfunction(fn):
        return False
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    inner = getattr(inner, "__func__", inner)  # a bound method
    code = getattr(inner, "__code__", None)
    return code is None or not code.co_flags & inspect.CO_ITERABLE_COROUTINE


def refuse_generator_result(fn: object, result: object) -> None:
    """Raise when a step returned a generator or an async generator instead of its results.

    The step's call is what decides, not how ``fn`` looks: a callable object, a lambda
    or a wrapper around a generator function returns one too. Awaiting it would run
    nothing, and the run would return the unstarted generators as the replicas' values.
    A generator that is awaitable (``@types.coroutine``) is a coroutine, not refused.
    """
    if inspect.isasyncgen(result):
        raise generator_step_error(fn, "an async generator")
    if inspect.isgenerator(result) and not inspect.isawaitable(result):
        result.close()
        raise generator_step_error(fn, "a generator")


def generator_step_error(fn: object, returned: str | None = None) -> TypeError:
    """The error for a step that is (``returned`` None) or returned a generator.

    Args:
        fn: The step.
        returned: What calling it returned ("a generator", "an async generator"), or
            None when ``fn`` itself is a generator function.
    """
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None)
    name = f"the {type(inner).__name__} object" if name is None else name
    if inner is not fn:
        name = f"functools.partial({name})"
    if returned is None:
        kind = "an async generator" if inspect.isasyncgenfunction(fn) else "a generator"
        what = f"{name} is {kind} function (it contains `yield`): calling it runs none of its code"
    else:
        what = (
            f"calling {name} returned {returned} object, not its results or a coroutine: "
            "a generator runs none of its code until it is iterated"
        )
    return TypeError(
        f"Strategy.run expects a step function, but {what}, so no replica would run its "
        "collectives.\n\n"
        "Write the step as `async def` with `return` instead of `yield` (return a tuple "
        "or a list for several values); to run several steps, call strategy.run once "
        "per step from your own loop."
    )
