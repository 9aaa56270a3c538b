"""Who may issue and await a replica's collectives: the slow paths of the ownership checks.

Every collective belongs to the replica that issued it. :class:`~._collective.Collective`
checks, when it is issued and again when it is awaited, that the running code is one of
that replica's tasks on the run's thread: an identity comparison with the replica's main
task, else one dict look-up among the helper tasks the run saw created inside the
replica. What fails those checks comes here, to be told apart and raised with a message
that says what happened and what to do:

* code running in another thread (``asyncio.to_thread``, ``anyio.to_thread``, an
  executor: they copy the replica's context, but a collective issued there would carry
  the thread pool's call path, so swapped ones would pair silently);
* a task of another replica (a collective object shared through a dict);
* a task the run did not see created (``asyncio.Task(coro)`` called directly, a task
  created in a ``loop.call_soon`` callback, or under a task factory the user installed
  during the run): the line that started it is unknown, so when call sites are checked
  its collectives are refused (two such helpers started in swapped order would pair
  silently); with ``check_call_sites=False`` it is adopted as the replica's task.

It also holds the rules that need the collective's neighbours: unnamed collectives are
awaited in the order they were issued (the call path is taken at issue, the position at
the await: both must describe the same moment), and a name is in flight at most once
per replica.

Each message is built once, by a function that needs no run (``thread_error``,
``completed_again``, ``name_taken``, ...): the run's checks raise it with the run's side
effects (failing the run, its report), and the default replica context's collectives
(``_default``), which have no run, raise the very same errors.

This module is interpreted on purpose (mypyc compiles the hot path that calls it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._core._report import mark_alike, see_also
from .._exceptions import AsyncReplicaError, CollectiveError, ReplicaContextError
from ._mode import MODE

if TYPE_CHECKING:
    from .._core._ledger import Report

    # What this module reads of a collective and its rendezvous (_collective, above).
    from ._protocols import OwnedCollective as Collective
    from ._protocols import OwnedRendezvous as Rendezvous

__all__ = [
    "close_in_flight",
    "closed_before",
    "closed_in_flight",
    "completed_again",
    "driven_by_hand",
    "foreign_await",
    "foreign_issue",
    "name_in_flight",
    "name_taken",
    "never_awaited",
    "out_of_order",
    "out_of_turn",
    "reused",
    "runs_as",
    "second_awaiter",
    "thread_error",
    "used_by_hand",
    "used_in_thread",
]


def _where(call: Collective) -> str:
    """``all_reduce(SUM) on float64[2] at train.py:12:17``, with the column.

    Two collectives told apart here are often created on one line.
    """
    site = call._signature.call_site
    described = call._signature.describe()
    return described if site is None else f"{described} at {site.describe(column=True)}"


def _owner(rv: Rendezvous, task: object) -> int:
    """The replica ``task`` belongs to, -1 when the run does not know it."""
    if task is None:
        return -1
    for replica, main in enumerate(rv.mains):
        if main is task:
            return replica
    return rv.helpers.get(id(task), -1)


def thread_error(what: str, described: str, replica: int) -> ReplicaContextError:
    """The error for ``what`` (issuing, awaiting) a collective in a thread not the loop's."""
    return ReplicaContextError(
        f"{what} {described} in a thread other than the event loop's "
        f"({threading.current_thread().name}), in replica {replica}.\n\n"
        "A worker thread (asyncio.to_thread, anyio.to_thread.run_sync, an executor) copies "
        "the replica's context, but it is not the replica: a collective issued there would "
        "carry the thread pool's call path, so two of them in swapped order would pair "
        "silently. Issue and await collectives in the replica's own coroutine (or a task it "
        "starts on the same loop), and move only the computation to the thread."
    )


def foreign_issue(rv: Rendezvous, call: Collective, task: object) -> BaseException | None:
    """Why the running code may not issue ``call``, a collective of its replica.

    Returns the error to raise (recorded as the run's root cause, unless raised in a
    thread: it reaches the replica through the thread's result), or None when ``task``
    was adopted as the replica's and the collective may go on.
    """
    run: Any = rv.run
    offset = run.strategy._replica_offset
    replica = call.replica
    if threading.get_ident() != rv.thread:
        # Not run._fail: the run's cancel scope belongs to the loop's thread.
        return thread_error("Collective", call._signature.describe(), replica + offset)
    described = call.describe()
    owner = _owner(rv, task)
    error: AsyncReplicaError
    if owner >= 0 and owner != replica:
        error = ReplicaContextError(
            f"Replica {owner + offset}'s task issued {described} for replica "
            f"{replica + offset}. A collective belongs to the replica that issues it: call "
            "asyncreplica.get_replica_context() in the coroutine that issues the collective."
        )
        run._fail(owner, error)
        return error
    if task is None:
        rest = (
            f" issued {described} outside any task (in a callback the event loop ran, such "
            "as loop.call_soon's). Issue collectives from the replica's coroutine or a task "
            "it starts with asyncio.create_task or a task group.\n"
            + see_also("ReplicaContextError")
        )
        error = ReplicaContextError(f"Replica {replica + offset}{rest}")
        mark_alike(error, rest)  # every replica running this code refuses it alike
        run._fail(replica, error)
        return error
    # A task the run did not see created, running in the replica's context.
    if not run.ledger._check_call_sites:
        adopt(rv, replica, task)
        return None
    replaced = _factory_replaced(run)
    get_coro = getattr(task, "get_coro", None)
    closing = get_coro is not None and type(get_coro()).__name__ == "async_generator_athrow"
    rest = (
        f" issued {described} in a task that the run did not see "
        "created, so the line that started the task is unknown: two such tasks started in "
        "swapped order would pair silently.\n\n"
        + (
            "This task is the event loop closing an async generator that was left unfinished "
            "(a break out of its `async for`): its finally block issued the collective. "
            "Close the generator in the replica's own code: `async with "
            "contextlib.aclosing(gen()) as it: async for x in it: ...`.\n\n"
            if closing
            else ""
        )
        + "The run sees tasks created with asyncio.create_task, loop.create_task, "
        "asyncio.ensure_future, asyncio.gather, task groups and nurseries, from the "
        "replica's own code. It does not see asyncio.Task(coro) called directly, a task "
        "created in a loop.call_soon callback, or one created under a task factory set "
        "during the run"
        + (" (loop.set_task_factory was called during this run)" if replaced else "")
        + ". Start the task with asyncio.create_task(...) or a task group, or pass "
        "check_call_sites=False to the strategy.\n" + see_also("CollectiveError")
    )
    error = CollectiveError(f"Replica {replica + offset}{rest}", report=run.ledger.report())
    mark_alike(error, rest)  # every replica running this code refuses it alike
    run._fail(replica, error)
    _reported(task)
    return error


def adopt(rv: Rendezvous, replica: int, task: object) -> None:
    """Record ``task`` as one of ``replica``'s tasks (found running in its context)."""
    run: Any = rv.run
    run.watch.adopt(replica, task)
    if isinstance(task, asyncio.Task):
        task.add_done_callback(run.task_done)


def _factory_replaced(run: Any) -> bool:
    """Whether the run's task factory was replaced on its loop (it is chained again)."""
    loop = run._loop
    if loop is None:
        return False
    from . import _tasks

    return _tasks.rechain_factory(loop)


def _loop_causes(rv: Rendezvous) -> str:
    """How a task the run does not count as a replica's comes about, on the run's loop."""
    if rv.loop is None:  # trio
        return (
            "started outside the replica's code, or by another replica's code in a copy of "
            "this replica's context"
        )
    return (
        "not started inside it, started by another replica's code in a copy of this "
        "replica's context, or started in a way the run does not see: asyncio.Task(coro) "
        "called directly, a loop.call_soon callback"
    )


# What a use of a collective is called in "a collective ... was <used> by ...".
#: The use of a collective whose ``__await__()`` iterator another task drove (next()).
DROVE = "drove the __await__() iterator of"

_PASSIVE = {
    "called send() on": "sent into (send())",
    "called throw() on": "thrown into (throw())",
    DROVE: "driven (its __await__() iterator, by hand)",
}


def used_in_thread(replica: int, described: str, use: str = "awaited") -> ReplicaContextError:
    """The error for ``use`` of a collective (awaited, closed, ...) in another thread."""
    return thread_error(f"A collective was {_PASSIVE.get(use, use)}", f"({described})", replica)


def foreign_await(
    rv: Rendezvous, call: Collective, task: object, use: str = "awaited"
) -> BaseException:
    """The error for ``use`` of ``call`` (awaited, closed, ...) by code not of its replica.

    Who created a task decides which replica it belongs to, never the context it runs
    in: a task the run did not see created by one of the replica's own tasks (one made
    with ``asyncio.Task(coro)``, in a loop callback, or by another replica's code under a
    copy of this replica's context) is refused, since it may be any replica's code.
    """
    run: Any = rv.run
    offset = run.strategy._replica_offset
    replica = call.replica
    described = call.describe()
    if threading.get_ident() != rv.thread:
        return used_in_thread(replica + offset, described, use)
    used = _PASSIVE.get(use, use)
    if run.closed:
        return ReplicaContextError(
            f"A collective of replica {replica + offset} ({described}) was {used} after the "
            f"{run.strategy.__class__.__name__}.run that issued it ended. A collective "
            "belongs to the run (and the replica) that issues it: issue a new one in this "
            "run."
        )
    owner = _owner(rv, task)
    error: AsyncReplicaError
    if owner >= 0 and owner != replica:
        error = ReplicaContextError(
            f"Replica {owner + offset} {use} a collective that replica {replica + offset} "
            f"issued: {described}.\n\n"
            "A collective belongs to the replica that issues it, and only that replica's "
            "tasks may await it (sharing collective objects between replicas, for example "
            "through a dict, would make one replica arrive twice and the other never, or "
            "hand one replica another's result). Each replica issues and awaits its own."
        )
        run._fail(owner, error)
        _reported(task)
        return error
    error = ReplicaContextError(
        f"A collective of replica {replica + offset} ({described}) was {used} "
        + (
            "outside any task"
            if task is None
            else f"by a task that is not one of the replica's ({_loop_causes(rv)})"
        )
        + ". Await a collective in the replica that issued it, in its own coroutine or a "
        "task it starts with "
        + ("a task group or nursery" if rv.loop is None else "asyncio.create_task or a task group")
        + "."
    )
    run._fail(replica, error)
    _reported(task)
    return error


def _reported(task: object) -> None:
    """The run reports the error raised in ``task``: asyncio need not log it again."""
    if isinstance(task, asyncio.Task):
        task.add_done_callback(_retrieve_error)


def _retrieve_error(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def reused(
    rv: Rendezvous, call: Collective, use: str, finished: bool, *, closed: bool
) -> BaseException:
    """The error for ``use`` of ``call`` once it was awaited, run as a task, or closed.

    Another replica's (or a thread's) use is :func:`foreign_await`'s error. The
    replica's own second use of a collective in flight fails the run (its first awaiter
    would otherwise be cancelled and blamed); one of a finished collective is its own
    mistake, raised where it happens. ``closed``: ``call`` was closed before it started.
    """
    task = rv.task()
    replica = call.replica
    if task is not rv.mains[replica] and rv.helpers.get(id(task), -1) != replica:
        return foreign_await(rv, call, task, use)
    run: Any = rv.run
    offset = run.strategy._replica_offset
    described = call.describe()
    if closed:
        return closed_before(replica + offset, use, described)
    if finished:
        return completed_again(replica + offset, use, described)
    how = "is being awaited" if call._driver is None else "runs as a task"
    error = second_awaiter(replica + offset, use, described, how, run.ledger.report())
    run._fail(replica, error)
    _reported(rv.task())  # the run raises it: a task that raises it again is not unread
    return error


def closed_before(replica: int, use: str, described: str) -> CollectiveError:
    """The error for ``use`` of a collective that its replica closed before it started."""
    rest = (
        f" {use} {described}, which it closed: a closed collective never runs. Issue a "
        "new collective instead."
    )
    error = CollectiveError(f"Replica {replica}{rest}")
    mark_alike(error, rest)  # every replica running this code refuses it alike
    return error


def completed_again(replica: int, use: str, described: str) -> CollectiveError:
    """The error for ``use`` of a collective again, once it completed (a second await)."""
    rest = (
        f" {use} {described} again, after it completed: a collective runs once. Keep its "
        "result (`result = await collective`) and use that."
    )
    error = CollectiveError(f"Replica {replica}{rest}")
    mark_alike(error, rest)  # every replica running this code refuses it alike
    return error


def second_awaiter(
    replica: int, use: str, described: str, how: str, report: Report | None = None
) -> CollectiveError:
    """The error for ``use`` of a collective that ``how`` (is being awaited) elsewhere."""
    return CollectiveError(
        f"Replica {replica} {use} {described} while it {how} elsewhere in the "
        "replica: a collective has one awaiter. Await it in one place, and share its "
        "result (or the task that awaits it) with the other code.\n" + see_also("CollectiveError"),
        report=report,
    )


def runs_as(task: object, call: Collective) -> bool:
    """Whether ``task`` (asyncio's or trio's) runs ``call`` as its own coroutine."""
    get_coro = getattr(task, "get_coro", None)
    coro = get_coro() if get_coro is not None else getattr(task, "coro", None)
    return coro is call


def driven_by_hand(rv: Rendezvous, call: Collective, use: str) -> BaseException:
    """The error for the replica's own code calling ``send``/``throw`` on ``call``."""
    run: Any = rv.run
    offset = run.strategy._replica_offset
    return used_by_hand(call.replica + offset, use, call.describe())


def used_by_hand(replica: int, use: str, described: str) -> CollectiveError:
    """The error for ``send``/``throw`` (``use``) called on a collective by hand."""
    return CollectiveError(
        f"Replica {replica} {use} {described} by hand: only the event "
        "loop drives a collective. Await it (`result = await "
        "collective`), or run it as a task (asyncio.create_task, a task group). The "
        "collective did not start, and may still be awaited."
    )


def close_in_flight(rv: Rendezvous, call: Collective) -> BaseException:
    """The error for closing ``call`` while it is awaited (the replica's own code)."""
    run: Any = rv.run
    offset = run.strategy._replica_offset
    return closed_in_flight(call.replica + offset, call.describe())


def closed_in_flight(replica: int, described: str) -> CollectiveError:
    """The error for closing a collective while it is awaited or runs as a task."""
    return CollectiveError(
        f"Replica {replica} closed {described} while it is in flight "
        "(awaited, or running as a task): closing it would leave its awaiter stranded. "
        "Cancel the task that awaits it instead."
    )


def unchecked(rv: Rendezvous, signature: Any) -> None:
    """A collective's call site could not be taken (no Python frame): warn, if it matters.

    It does not when call sites are not compared: ``check_call_sites=False``, or a name.
    """
    if signature.name is None and rv.run.ledger._check_call_sites:
        from ._inspect import warn_unchecked

        warn_unchecked()


def out_of_order(rv: Rendezvous, call: Collective) -> BaseException | None:
    """The error when ``call`` (unnamed) is awaited before an older unnamed collective.

    The call path is taken when a collective is issued and its position when it is
    awaited: awaiting unnamed collectives in another order than they were issued would
    pair each replica's path with another collective's position, so it is refused.
    """
    older: Collective | None = None
    for pending in rv.unawaited[call.replica].values():
        if pending is call:
            break
        if pending._signature[6] is None:
            older = pending
            break
    if older is None:
        return None
    run: Any = rv.run
    offset = run.strategy._replica_offset
    error = out_of_turn(call.replica + offset, call, older, run.ledger.report())
    run._fail(call.replica, error)
    _reported(rv.task())  # a task awaiting it (asyncio.wait's) raises it again, unread
    return error


def out_of_turn(
    replica: int, call: Collective, older: Collective, report: Report | None = None
) -> CollectiveError:
    """The error for awaiting unnamed ``call`` before ``older``, issued earlier."""
    rest = (
        f" awaited {_where(call)} before "
        f"{_where(older)}, which it issued earlier and has not awaited.\n\n"
        "A collective's call site is taken when it is created and its position when it is "
        "awaited, so unnamed collectives must be awaited in the order they are created "
        "(otherwise two replicas awaiting them in different orders would pair different "
        "values at the same position). Await each collective where you create it, or give "
        "collectives that may be awaited in any order a name=.\n" + see_also("CollectiveError")
    )
    error = CollectiveError(f"Replica {replica}{rest}", report=report)
    mark_alike(error, rest)  # every replica running this code refuses it alike
    return error


def name_in_flight(rv: Rendezvous, replica: int, name: str, described: str) -> BaseException:
    """The error for issuing a second collective named ``name`` while one is in flight."""
    run: Any = rv.run
    offset = run.strategy._replica_offset
    earlier = rv.names[replica][name]
    error = name_taken(replica + offset, name, described, earlier, run.ledger.report())
    run._fail(replica, error)
    _reported(rv.task())  # the run raises it: a task that raises it again is not unread
    return error


def name_taken(
    replica: int, name: str, described: str, earlier: Collective, report: Report | None = None
) -> CollectiveError:
    """The error for issuing ``described`` named ``name`` while ``earlier`` is in flight."""
    return CollectiveError(
        f"Replica {replica} issued {described} while its collective named "
        f"{name!r} issued earlier ({_where(earlier)}) has not completed.\n\n"
        "Named collectives match by name and use: two uses of one name in flight at once in "
        "one replica would pair by arrival order, which depends on scheduling. Give each "
        "collective in flight its own name, or await the first before issuing the second.\n"
        + see_also("CollectiveError"),
        report=report,
    )


def never_awaited(
    replica: int, described: Sequence[str], report: Report | None = None
) -> CollectiveError:
    """The error for the collectives (``described``) a replica created and never awaited."""
    sites = "\n".join(f"  * {text}" for text in described)
    return CollectiveError(
        f"Replica {replica} created {len(described)} collective"
        f"{'' if len(described) == 1 else 's'} that it never awaited:\n\n{sites}\n\n"
        "A collective runs only when awaited; without `await` this replica skips it "
        "while its peers wait for it. Write `await ctx.all_reduce(...)`.\n"
        + see_also("CollectiveError"),
        report=report,
    )


def in_merge_fn() -> bool:
    """Whether the running code is in cross-replica context (a merge_fn, while one runs)."""
    mode = MODE.get()
    return mode is not None and mode.cross_replica


def awaited_in_merge_fn(rv: Rendezvous, call: Collective) -> BaseException:
    """The error for awaiting a replica's collective inside a merge_fn.

    merge_fn runs once for every replica while they all wait at merge_call: a collective
    a replica issued before merge_call, awaited there, waits for peers that wait for the
    merge_fn (a cycle: a hang without a timeout, a false "cancelled" story with one).
    """
    run: Any = rv.run
    offset = run.strategy._replica_offset
    replica = call.replica + offset
    error = ReplicaContextError(
        f"A merge_fn awaited a collective that replica {replica} issued before merge_call: "
        f"{call.describe()}.\n\n"
        "merge_fn runs once, in cross-replica context, while every replica waits at "
        "merge_call, so no replica can arrive at that collective until merge_fn returns: "
        "it could never complete. Await the collective in the step function, before "
        "merge_call or after it returns; inside merge_fn, use the cross-replica APIs "
        "(await strategy.reduce(...), await strategy.extended.reduce_to(...))."
    )
    run._fail(call.replica, error)
    _reported(rv.task())  # the run raises it: a task that raises it again is not unread
    return error
