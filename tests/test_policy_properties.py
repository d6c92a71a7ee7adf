"""Property-based tests of two pure policies: the join decision (``actors/join_policy.decide``)
and the retry classification of a failed tool call (``actors/tools.classify``), with the
backoff bounds a ``RetryPolicy`` feeds into.

The join semantics asserted are those of the "Join policies" table in docs/workflows.md;
the classification those of "Failure classes and the retry decision" in docs/side-effects.md.
Join policies are generated as the workflow validator accepts them (``at_least`` with
``1 <= k <= branches``, ``required`` mode with at least one required branch, ``required`` and
``defaults`` naming known branches). Branch statuses are the live ones a join decides on
(RUNNING, SUCCEEDED, FAILED, TIMED_OUT); rows become CANCELLED once the join no longer
needs them (its verdict, a task cancel), so ``decide``'s handling of CANCELLED is not asserted.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Literal, TypeVar

from hypothesis import assume, given
from hypothesis import strategies as st

from ratchet.actors.core.backoff import backoff_delay
from ratchet.actors.workflow.join_policy import JoinVerdict, decide, may_decide
from ratchet.actors.workflow.nodes import JoinPolicy
from ratchet.actors.workflow.tools import Decision, RetryPolicy, classify
from ratchet.protocol.errors import (
    RatchetError,
    ToolConflict,
    ToolDeadlineExceeded,
    ToolDefinitionError,
    ToolError,
    ToolInvalidArgument,
    ToolOutcomeUnknown,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
    Unavailable,
    VersionConflict,
)

# -- join decisions -------------------------------------------------------------------------

NAMES = ("a", "b", "c", "d", "e", "f")
LIVE = ("RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT")
SETTLED = ("SUCCEEDED", "FAILED", "TIMED_OUT")
#: The live statuses, drawn with success more likely: for properties about ok verdicts.
HOPEFUL = ("SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "RUNNING", "FAILED", "TIMED_OUT")
#: The live statuses, drawn with RUNNING more likely: for properties about waiting joins.
PENDING = ("RUNNING", "RUNNING", "RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT")
BAD = frozenset({"FAILED", "TIMED_OUT"})
Mode = Literal["all", "at_least", "required"]
MODES: tuple[Mode, ...] = ("all", "at_least", "required")
T = TypeVar("T")

Case = tuple[JoinPolicy, dict[str, str], bool]


@functools.cache
def _lists(elements: tuple[T, ...], n: int) -> st.SearchStrategy[list[T]]:
    return st.lists(st.sampled_from(elements), min_size=n, max_size=n)


def picked(names: tuple[str, ...], mask: list[bool]) -> set[str]:
    return {b for b, pick in zip(names, mask, strict=True) if pick}


@st.composite
def join_cases(
    draw: st.DrawFn,
    modes: tuple[Mode, ...] = MODES,
    statuses: tuple[str, ...] = LIVE,
    with_defaults: bool = True,
    timeouts: tuple[bool, ...] = (False, True),
) -> Case:
    """A valid policy over 1..6 branches, their statuses, and whether the join timed out."""
    n = draw(st.integers(1, len(NAMES)))
    names = NAMES[:n]
    mode = draw(st.sampled_from(modes))
    required = picked(names, draw(_lists((False, True), n)))
    if mode == "required" and not required:
        required.add(names[draw(st.integers(0, n - 1))])
    k = draw(st.integers(1, n)) if mode == "at_least" else None
    chosen = picked(names, draw(_lists((False, True), n))) if with_defaults else set()
    defaults = {b: f"default of {b}" for b in sorted(chosen)}
    policy = JoinPolicy(mode=mode, k=k, required=frozenset(required),
                        defaults=defaults)
    status = dict(zip(names, draw(_lists(statuses, n)), strict=True))
    return policy, status, draw(st.sampled_from(timeouts))


def effective(statuses: Mapping[str, str], timed_out: bool) -> dict[str, str]:
    """The statuses as the join sees them: after its timeout, RUNNING counts as TIMED_OUT."""
    return {b: "TIMED_OUT" if timed_out and s == "RUNNING" else s for b, s in statuses.items()}


def with_status(statuses: Mapping[str, str], branches: Collection[str],
                status: str) -> dict[str, str]:
    return {b: status if b in branches else s for b, s in statuses.items()}


def named(statuses: Mapping[str, str], *wanted: str) -> list[str]:
    return sorted(b for b, s in statuses.items() if s in wanted)


def must_succeed(policy: JoinPolicy, statuses: Mapping[str, str]) -> set[str]:
    """The branches whose failure fails an ``all`` or ``required`` join."""
    return set(statuses) if policy.mode == "all" else set(policy.required)


def verdict_of(case: Case) -> JoinVerdict | None:
    policy, statuses, timed_out = case
    return decide(policy, statuses, timed_out)


@given(join_cases(statuses=SETTLED))
def test_a_join_whose_branches_all_finished_always_has_a_verdict(case: Case) -> None:
    assert verdict_of(case) is not None


@given(join_cases(timeouts=(True,)))
def test_a_timed_out_join_always_has_a_verdict(case: Case) -> None:
    assert verdict_of(case) is not None


@given(join_cases())
def test_a_join_waits_only_while_some_branch_is_running_before_its_timeout(case: Case) -> None:
    _, statuses, timed_out = case
    if verdict_of(case) is None:
        assert not timed_out and "RUNNING" in statuses.values()


@given(st.one_of(join_cases(), join_cases(statuses=PENDING)))
def test_a_join_whose_counts_say_it_waits_has_no_verdict(case: Case) -> None:
    # The constant-time pre-check a wide join runs at every notification never hides a
    # verdict that decide would reach.
    policy, statuses, timed_out = case
    if not may_decide(policy, Counter(statuses.values()), timed_out):
        assert verdict_of(case) is None


@given(join_cases())
def test_a_verdict_puts_each_branch_in_the_list_of_its_status(case: Case) -> None:
    _, statuses, timed_out = case
    verdict = verdict_of(case)
    assume(verdict is not None)
    assert verdict is not None
    seen = effective(statuses, timed_out)
    assert verdict.succeeded == named(seen, "SUCCEEDED")
    assert verdict.failed == named(seen, "FAILED")
    assert verdict.timed_out == named(seen, "TIMED_OUT")
    # Still running when the verdict came (also when timed out): to be cancelled.
    assert verdict.unfinished == named(statuses, "RUNNING")


@given(join_cases(modes=("all",), with_defaults=False, statuses=SETTLED))
def test_an_all_join_without_defaults_is_ok_exactly_when_every_branch_succeeded(
    case: Case,
) -> None:
    _, statuses, _ = case
    verdict = verdict_of(case)
    assert verdict is not None
    assert verdict.ok == all(s == "SUCCEEDED" for s in statuses.values())


@given(join_cases(modes=("all", "required")))
def test_an_all_or_required_join_fails_at_once_when_a_branch_it_needs_is_bad_without_a_default(
    case: Case,
) -> None:
    policy, statuses, timed_out = case
    seen = effective(statuses, timed_out)
    needed = must_succeed(policy, statuses)
    hopeless = [b for b in named(seen, *BAD) if b in needed and b not in policy.defaults]
    verdict = verdict_of(case)
    if hopeless:
        assert verdict is not None and not verdict.ok  # even with other branches running
    elif "RUNNING" in seen.values():
        assert verdict is None  # waits for every branch, optional ones too
    else:
        assert verdict is not None and verdict.ok


@given(join_cases(modes=("required",), statuses=SETTLED))
def test_a_finished_required_join_is_ok_exactly_when_each_required_branch_succeeded_or_degrades(
    case: Case,
) -> None:
    policy, statuses, _ = case
    verdict = verdict_of(case)
    assert verdict is not None
    assert verdict.ok == all(statuses[b] == "SUCCEEDED" or b in policy.defaults
                             for b in policy.required)


@given(join_cases(modes=("required",)))
def test_optional_branches_never_fail_a_required_join(case: Case) -> None:
    policy, statuses, timed_out = case
    statuses = with_status(statuses, policy.required, "SUCCEEDED")
    verdict = decide(policy, statuses, timed_out)
    assert verdict is None or verdict.ok


@given(join_cases(modes=("at_least",)))
def test_an_at_least_join_is_ok_once_k_succeeded_and_fails_once_k_is_out_of_reach(
    case: Case,
) -> None:
    policy, statuses, timed_out = case
    assert policy.k is not None
    seen = effective(statuses, timed_out)
    succeeded, running = len(named(seen, "SUCCEEDED")), len(named(seen, "RUNNING"))
    verdict = verdict_of(case)
    # Defaults are generated too: they never count towards k.
    if succeeded >= policy.k:
        assert verdict is not None and verdict.ok
    elif succeeded + running < policy.k:
        assert verdict is not None and not verdict.ok
    else:
        assert verdict is None


@given(join_cases(modes=("at_least",), statuses=SETTLED), st.integers(1, len(NAMES)))
def test_a_finished_at_least_join_is_ok_exactly_when_k_branches_succeeded(
    case: Case, k: int,
) -> None:
    policy, statuses, timed_out = case
    k = min(k, len(statuses))  # k=1 is "any", k=len is "all", between them a quorum
    policy = JoinPolicy(mode="at_least", k=k, defaults=policy.defaults)
    verdict = decide(policy, statuses, timed_out)
    assert verdict is not None
    assert verdict.ok == (len(named(statuses, "SUCCEEDED")) >= k)


@given(join_cases())
def test_degraded_lists_only_failed_or_timed_out_branches_that_have_a_default(
    case: Case,
) -> None:
    policy, _, _ = case
    verdict = verdict_of(case)
    assume(verdict is not None)
    assert verdict is not None
    assert set(verdict.degraded) <= set(verdict.failed) | set(verdict.timed_out)
    assert set(verdict.degraded) <= set(policy.defaults)
    assert not set(verdict.degraded) & set(verdict.succeeded)


@given(join_cases(modes=("all", "required"), statuses=HOPEFUL))
def test_an_ok_all_or_required_join_degrades_every_bad_branch_that_has_a_default(
    case: Case,
) -> None:
    policy, statuses, timed_out = case
    verdict = verdict_of(case)
    assume(verdict is not None and verdict.ok)
    assert verdict is not None
    seen = effective(statuses, timed_out)
    assert verdict.degraded == [b for b in named(seen, *BAD) if b in policy.defaults]


@given(join_cases(modes=("all", "required"), statuses=HOPEFUL))
def test_an_ok_joins_output_is_each_succeeded_result_and_each_degraded_default(
    case: Case,
) -> None:
    policy, statuses, timed_out = case
    verdict = verdict_of(case)
    assume(verdict is not None and verdict.ok)
    assert verdict is not None
    seen = effective(statuses, timed_out)
    results = {b: f"result of {b}" for b in named(seen, "SUCCEEDED")}
    expected: dict[str, object] = dict(results)
    expected.update({b: policy.defaults[b] for b in named(seen, *BAD) if b in policy.defaults})
    # An optional branch that went bad without a default is absent.
    assert verdict.values(results, policy.defaults) == expected


@given(join_cases(statuses=HOPEFUL), st.sets(st.sampled_from(NAMES)))
def test_more_successes_never_spoil_an_ok_verdict(case: Case, promoted: set[str]) -> None:
    policy, statuses, timed_out = case
    verdict = verdict_of(case)
    assume(verdict is not None and verdict.ok)
    better = decide(policy, with_status(statuses, promoted, "SUCCEEDED"), timed_out)
    assert better is not None and better.ok


@given(join_cases(), st.sets(st.sampled_from(NAMES)), st.sampled_from(sorted(BAD)))
def test_more_failures_never_rescue_a_failed_verdict(
    case: Case, demoted: set[str], bad: str,
) -> None:
    policy, statuses, timed_out = case
    verdict = verdict_of(case)
    assume(verdict is not None and not verdict.ok)
    worse = decide(policy, with_status(statuses, demoted, bad), timed_out)
    assert worse is not None and not worse.ok


@given(join_cases(timeouts=(False,)), st.data())
def test_a_verdict_reached_before_the_timeout_stands_however_the_running_branches_end(
    case: Case, data: st.DataObject,
) -> None:
    policy, statuses, _ = case
    verdict = verdict_of(case)
    assume(verdict is not None)
    assert verdict is not None
    later = {b: data.draw(st.sampled_from(SETTLED)) if s == "RUNNING" else s
             for b, s in statuses.items()}
    again = decide(policy, later, data.draw(st.booleans()))
    assert again is not None and again.ok == verdict.ok


@given(join_cases(statuses=PENDING, timeouts=(False,)))
def test_a_waiting_join_would_be_ok_if_every_running_branch_succeeded(case: Case) -> None:
    policy, statuses, timed_out = case
    assume(verdict_of(case) is None)
    best = decide(policy, with_status(statuses, named(statuses, "RUNNING"), "SUCCEEDED"),
                  timed_out)
    assert best is not None and best.ok


# -- retry classification ---------------------------------------------------------------------


class CustomInvalidArgument(ToolInvalidArgument):
    pass


class CustomRateLimited(ToolRateLimited):
    pass


class CustomTransient(ToolTransient):
    pass


class CustomOutcomeUnknown(ToolOutcomeUnknown):
    pass


NEVER_RETRIED: tuple[type[ToolError], ...] = (
    ToolInvalidArgument, ToolPermissionDenied, ToolConflict, ToolDeadlineExceeded,
    CustomInvalidArgument,
)
RATE_LIMITED: tuple[type[ToolRateLimited], ...] = (ToolRateLimited, CustomRateLimited)
TRANSIENT: tuple[type[ToolTransient], ...] = (ToolTransient, CustomTransient)
RETRIED: tuple[type[ToolError], ...] = (*RATE_LIMITED, *TRANSIENT, ToolOutcomeUnknown)
#: A never-retried class mixed with a retried one, e.g. a conflict that is also transient.
MIXED: tuple[type[ToolError], ...] = tuple(
    type(f"{n.__name__}And{r.__name__}", (n, r), {})
    for n in NEVER_RETRIED[:4] for r in RETRIED
)
UNCLASSIFIED_TOOL: tuple[type[RatchetError], ...] = (
    ToolOutcomeUnknown, CustomOutcomeUnknown, ToolError, Unavailable, VersionConflict,
)
BUILTIN: tuple[type[Exception], ...] = (
    Exception, ValueError, RuntimeError, KeyError, TimeoutError, ConnectionError, OSError,
)

Kind = Literal["read", "write"]
kinds: st.SearchStrategy[Kind] = st.sampled_from(("read", "write"))
messages = st.text(max_size=20)
retry_afters = st.none() | st.floats(-10.0, 1e6, allow_nan=False)


def ratchet_errors(classes: tuple[type[RatchetError], ...]) -> st.SearchStrategy[RatchetError]:
    return st.builds(lambda cls, msg, retryable: cls(msg, retryable=retryable),
                     st.sampled_from(classes), messages, st.none() | st.booleans())


never_retried = ratchet_errors(NEVER_RETRIED) | ratchet_errors(MIXED)
rate_limited = st.builds(lambda cls, msg, after: cls(msg, retry_after=after),
                         st.sampled_from(RATE_LIMITED), messages, retry_afters)
transient = ratchet_errors(TRANSIENT)
unclassified = ratchet_errors(UNCLASSIFIED_TOOL) | st.builds(
    lambda cls, msg: cls(msg), st.sampled_from(BUILTIN), messages)
any_failure = never_retried | rate_limited | transient | unclassified


@given(never_retried, kinds)
def test_a_never_retried_error_fails_whatever_the_kind_and_whatever_else_it_is(
    exc: BaseException, kind: Kind,
) -> None:
    assert classify(exc, kind) is Decision.FAIL


@given(rate_limited, kinds)
def test_a_rate_limited_call_waits_for_the_provider_whatever_the_kind(
    exc: BaseException, kind: Kind,
) -> None:
    assert classify(exc, kind) is Decision.RETRY_AFTER


@given(transient, kinds)
def test_a_transient_failure_backs_off_whatever_the_kind(exc: BaseException, kind: Kind) -> None:
    assert classify(exc, kind) is Decision.BACKOFF


@given(unclassified)
def test_any_other_failure_is_an_unknown_outcome_for_a_write_and_transient_for_a_read(
    exc: BaseException,
) -> None:
    assert classify(exc, "write") is Decision.UNKNOWN
    assert classify(exc, "read") is Decision.BACKOFF


@given(any_failure, kinds)
def test_a_write_is_resent_only_on_errors_saying_nothing_was_done(
    exc: BaseException, kind: Kind,
) -> None:
    decision = classify(exc, kind)
    if kind == "write" and decision in (Decision.BACKOFF, Decision.RETRY_AFTER):
        assert isinstance(exc, ToolTransient | ToolRateLimited)


@given(any_failure)
def test_a_read_is_never_left_with_an_unknown_outcome(exc: BaseException) -> None:
    assert classify(exc, "read") is not Decision.UNKNOWN


@given(any_failure)
def test_the_kind_only_matters_for_a_failure_that_may_have_taken_effect(
    exc: BaseException,
) -> None:
    read, write = classify(exc, "read"), classify(exc, "write")
    if read is not write:
        assert (read, write) == (Decision.BACKOFF, Decision.UNKNOWN)
        assert not isinstance(exc, ToolTransient | ToolRateLimited)


@given(st.sampled_from((*NEVER_RETRIED, *RETRIED, *UNCLASSIFIED_TOOL)), messages,
       st.booleans(), kinds)
def test_the_retryable_flag_and_the_message_do_not_change_the_decision(
    cls: type[RatchetError], message: str, retryable: bool, kind: Kind,
) -> None:
    plain = classify(cls("x"), kind)
    assert classify(cls(message, retryable=retryable), kind) is plain


# -- retry policy bounds ------------------------------------------------------------------------


class TopOfRange(random.Random):
    """An rng whose ``uniform`` returns the upper bound: the ceiling of a jittered delay."""

    def uniform(self, a: float, b: float) -> float:
        return b


retry_policies = st.builds(
    lambda attempts, base, extra: RetryPolicy(attempts, base, base + extra),
    st.integers(1, 20), st.floats(0.0, 100.0), st.floats(0.0, 1000.0))


@given(st.integers(-3, 10), st.floats(-10.0, 100.0, allow_nan=False),
       st.floats(-10.0, 100.0, allow_nan=False))
def test_a_retry_policy_is_accepted_exactly_when_its_bounds_are_consistent(
    max_attempts: int, base_delay: float, max_delay: float,
) -> None:
    consistent = max_attempts >= 1 and 0 <= base_delay <= max_delay
    try:
        RetryPolicy(max_attempts, base_delay, max_delay)
    except ToolDefinitionError:
        assert not consistent
    else:
        assert consistent


@given(retry_policies, st.integers(1, 200), st.integers(0, 2**32))
def test_the_delay_before_a_retry_is_never_negative_nor_above_the_policy_ceiling(
    policy: RetryPolicy, attempt: int, seed: int,
) -> None:
    # As the action runner computes it: after failed attempt n, backoff_delay(n - 1, ...).
    delay = backoff_delay(attempt - 1, policy.base_delay, policy.max_delay, random.Random(seed))
    assert 0.0 <= delay <= policy.max_delay
    assert delay <= policy.base_delay * 2 ** (attempt - 1)


@given(retry_policies, st.integers(1, 200))
def test_the_backoff_ceiling_starts_at_base_delay_and_doubles_up_to_max_delay(
    policy: RetryPolicy, attempt: int,
) -> None:
    def ceiling(n: int) -> float:
        return backoff_delay(n - 1, policy.base_delay, policy.max_delay, TopOfRange())

    assert ceiling(1) == min(policy.base_delay, policy.max_delay)
    assert ceiling(attempt) <= ceiling(attempt + 1) <= policy.max_delay
    # Doubling stops at max_delay (and, as an overflow guard, after 60 doublings).
    if ceiling(attempt + 1) < policy.max_delay and attempt <= 60:
        assert ceiling(attempt + 1) == 2 * ceiling(attempt)
