"""Loop detection is a pure function over the turn history."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ratchet.actors.agents.loop_detect import LoopPolicy, TurnRecord, detect

P = LoopPolicy(repeat=3, alternation=6, watch_field="status", window=6, flips=4)


def turn(fp: str, *calls: str, new: bool = False, value: object = None) -> TurnRecord:
    return TurnRecord(fp, tuple(calls), new, value)


def test_the_same_call_three_times_without_new_artifacts_is_no_progress() -> None:
    found = detect([turn("x", "search"), turn("x", "search"), turn("x", "search")], P)
    assert found is not None and found.pattern == "no_progress"
    assert found.evidence == {"fingerprint": "x", "times": 3, "calls": ["search"]}


def test_repeats_that_keep_finding_new_artifacts_are_progress() -> None:
    assert detect([turn("x", "page", new=True)] * 3, P) is None


def test_abab_alternation_is_detected() -> None:
    history = [turn(f"f{i}", "open" if i % 2 == 0 else "close", new=True) for i in range(6)]
    found = detect(history, P)
    assert found is not None and found.pattern == "alternation"
    assert found.evidence["sequence"] == ["open", "close"] * 3


def test_a_field_oscillating_between_two_values_is_detected() -> None:
    history = [turn(f"f{i}", f"t{i}", new=True, value="open" if i % 2 else "closed")
               for i in range(6)]
    found = detect(history, P)
    assert found is not None and found.pattern == "oscillation"


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=30, unique=True))
def test_turns_that_all_differ_are_never_a_loop(ids: list[int]) -> None:
    history = [turn(f"f{i}", f"tool{i}", new=True, value=i) for i in ids]
    assert detect(history, P) is None
