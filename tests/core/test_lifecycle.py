"""The replica lifecycle table (asyncreplica/_core/_lifecycle.py): total, and one test per cell.

Each cell of the table is checked twice: against an independent statement of which
transitions are legal (``LEGAL`` below, written from the docs, not from the table), and
by driving a :class:`Lifecycle` into the cell's state along legal events and applying
the cell's event: the next state, or an ``InternalError`` from the one raise site.
"""

from __future__ import annotations

import itertools
from collections import deque

import pytest

import asyncreplica as ar
from asyncreplica._core._lifecycle import (
    ILLEGAL,
    OUTCOME,
    TRANSITIONS,
    Event,
    Lifecycle,
    Outcome,
    State,
)

S, E = State, Event

# What docs/design.md ("The replica lifecycle") says, cell by cell: every pair not
# listed here is illegal.
LEGAL: dict[tuple[State, Event], State] = {
    (S.NOT_STARTED, E.START): S.RUNNING,
    (S.NOT_STARTED, E.SKIP): S.SKIPPED,
    (S.NOT_STARTED, E.CANCEL): S.CANCELLED,
    (S.NOT_STARTED, E.CANCEL_OUTSIDE): S.CANCELLED_OUTSIDE,
    (S.RUNNING, E.RETURN): S.RETURNED,
    (S.RUNNING, E.RAISE): S.RAISED,
    (S.RUNNING, E.INTERRUPT): S.INTERRUPTED,
    (S.RUNNING, E.CANCEL): S.CANCELLED,
    (S.RUNNING, E.CANCEL_OUTSIDE): S.CANCELLED_OUTSIDE,
    (S.RUNNING, E.CLOSE): S.CLOSED,
    (S.RUNNING, E.BUG): S.BROKEN,
}
CELLS = list(itertools.product(State, Event))


def _path_to(state: State) -> list[Event]:
    """The shortest sequence of legal events from NOT_STARTED to ``state``."""
    seen = {S.NOT_STARTED: list[Event]()}
    queue = deque([S.NOT_STARTED])
    while queue:
        here = queue.popleft()
        for event, nxt in TRANSITIONS[here].items():
            if isinstance(nxt, State) and nxt not in seen:
                seen[nxt] = [*seen[here], event]
                queue.append(nxt)
    return seen[state]


def test_the_table_is_total() -> None:
    assert set(TRANSITIONS) == set(State)
    for state, row in TRANSITIONS.items():
        assert set(row) == set(Event), f"row {state.name} misses events"
        for nxt in row.values():
            assert nxt is ILLEGAL or isinstance(nxt, State)


def test_every_state_is_reachable_from_not_started() -> None:
    for state in State:
        life = Lifecycle(1)
        for event in _path_to(state):
            life.handle(0, event)
        assert life.states[0] is state


def test_every_final_state_has_an_outcome_and_only_returning_gives_a_result() -> None:
    finals = {s for s in State if all(n is ILLEGAL for n in TRANSITIONS[s].values())}
    assert set(OUTCOME) == finals
    assert [s for s, o in OUTCOME.items() if o is Outcome.RESULT] == [S.RETURNED]
    # A replica that ends by itself any other way fails the run; only a run that already
    # failed (or was cancelled around it) explains a replica without a result.
    assert {s for s, o in OUTCOME.items() if o is Outcome.CONSEQUENCE} == {
        S.CANCELLED,
        S.SKIPPED,
    }


@pytest.mark.parametrize(("state", "event"), CELLS, ids=[f"{s.name}-{e.name}" for s, e in CELLS])
def test_cell(state: State, event: Event) -> None:
    expected = LEGAL.get((state, event), ILLEGAL)
    assert TRANSITIONS[state][event] == expected

    life = Lifecycle(3, offset=4)
    for step in _path_to(state):
        life.handle(1, step)
    assert life.states == [S.NOT_STARTED, state, S.NOT_STARTED]
    if expected is ILLEGAL:
        with pytest.raises(ar.InternalError) as info:
            life.handle(1, event)
        message = str(info.value)
        assert f"replica 5 got the lifecycle event {event.name} in state {state.name}" in message
        assert "This is a bug in asyncreplica" in message
        assert info.value.code == "AR110"
        assert life.states[1] is state  # an illegal event changes nothing
    else:
        assert life.handle(1, event) is expected
        assert life.states == [S.NOT_STARTED, expected, S.NOT_STARTED]
        assert life.final(1) == (expected in OUTCOME)
        assert life.outcome(1) is OUTCOME.get(expected)


def test_replicas_in() -> None:
    life = Lifecycle(3)
    life.handle(0, E.START)
    life.handle(2, E.SKIP)
    assert life.replicas_in([S.RUNNING, S.SKIPPED]) == [0, 2]
    assert life.replicas_in([S.NOT_STARTED]) == [1]
