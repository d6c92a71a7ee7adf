"""The task state machine: one table, every legal move accepted, the rest rejected."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratchet.protocol import IllegalTransition, TaskEvent, TaskStatus, transition
from ratchet.protocol.states import TERMINAL, TRANSITIONS

ALL_PAIRS = list(itertools.product(TaskStatus, TaskEvent))


@pytest.mark.parametrize(("status", "event"), list(TRANSITIONS))
def test_every_legal_transition_is_accepted(status: TaskStatus, event: TaskEvent) -> None:
    assert transition(status, event) is TRANSITIONS[(status, event)]


@pytest.mark.parametrize(("status", "event"), [p for p in ALL_PAIRS if p not in TRANSITIONS])
def test_every_illegal_transition_is_rejected_with_a_typed_error(
    status: TaskStatus, event: TaskEvent
) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(status, event)
    assert info.value.code.value == "ILLEGAL_TRANSITION"
    assert info.value.details == {"status": status.value, "event": event.value}


def test_terminal_states_have_no_outgoing_transitions() -> None:
    assert TERMINAL == {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED}
    assert not [key for key in TRANSITIONS if key[0] in TERMINAL]


def test_every_non_terminal_state_can_reach_a_terminal_one() -> None:
    for status in set(TaskStatus) - TERMINAL:
        seen, frontier = {status}, [status]
        while frontier:
            here = frontier.pop()
            for (src, _), dst in TRANSITIONS.items():
                if src is here and dst not in seen:
                    seen.add(dst)
                    frontier.append(dst)
        assert seen & TERMINAL, status


def test_cancelled_is_distinct_from_failed_and_reachable_from_paused() -> None:
    assert transition(TaskStatus.PAUSED, TaskEvent.CANCELLED) is TaskStatus.CANCELLED
    with pytest.raises(IllegalTransition):
        transition(TaskStatus.PAUSED, TaskEvent.FAILED)


@given(st.lists(st.sampled_from(list(TaskEvent)), max_size=40))
def test_random_event_sequences_never_leave_a_terminal_state(events: list[TaskEvent]) -> None:
    status = TaskStatus.QUEUED
    reached_terminal_as: TaskStatus | None = None
    for event in events:
        try:
            status = transition(status, event)
        except IllegalTransition:
            assert (status, event) not in TRANSITIONS
            continue
        if reached_terminal_as is not None:
            pytest.fail(f"left terminal state {reached_terminal_as} via {event}")
        if status in TERMINAL:
            reached_terminal_as = status
    if reached_terminal_as is not None:
        assert status is reached_terminal_as
