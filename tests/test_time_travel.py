"""Time travel (issue 15, item 4): ``admin state --at``, ``admin diff``, ``admin bisect``
(supervisors/services/admin_history.py, protocol/state_history.py) on a real node."""

from __future__ import annotations

import pytest

import ratchet
from ratchet.protocol.errors import InvalidMessage
from ratchet.protocol.messages import Reply
from ratchet.protocol.state_history import parse_predicate, structural_diff
from tests.conftest import NodeFactory, wait_terminal
from tests.test_admin import VIEWER, admin


def test_a_structural_diff_names_each_path_added_removed_and_changed() -> None:
    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": True}
    new = {"a": 1, "b": {"c": [1, 3, 4], "d": "y"}, "new": None}
    assert structural_diff(old, new) == {
        "added": [["b.c.2", 4], ["new", None]], "removed": [["gone", True]],
        "changed": [["b.c.1", 2, 3], ["b.d", "x", "y"]]}
    assert structural_diff({"n": 1}, {"n": 1.0}) == {"added": [], "removed": [],
                                                     "changed": [["n", 1, 1.0]]}


def test_a_predicate_is_a_small_language_not_code() -> None:
    state = {"count": 5, "claim": {"status": "done"}, "items": [{"amount": 3}]}
    assert parse_predicate('count >= 5 and claim.status == "done"').holds(state)
    assert parse_predicate("claim.status == done and has items.0.amount").holds(state)
    assert not parse_predicate("items.0.amount > 3").holds(state)
    assert not parse_predicate('count < "x"').holds(state)  # not comparable: false
    assert not parse_predicate("missing.path == 1").holds(state)
    for bad in ("", "__import__('os').system('x')", "count", "x" * 1001, 42):
        with pytest.raises(InvalidMessage):
            parse_predicate(bad)


async def test_state_diff_and_bisect_read_a_tasks_past_states(
    start_node: NodeFactory, client: ratchet.Client
) -> None:
    await start_node()
    task_id = (await client.submit("ten", {}, key="tt-1")).task_id
    await wait_terminal(client, task_id)

    async def ask(verb: str, command_id: str, **args: object) -> Reply:
        return await admin(client, verb, command_id=command_id, principal=VIEWER,
                           task_id=task_id, args=args)

    at3 = await ask("state", "tt-s3", at=3)
    assert at3.ok and at3.result is not None
    assert at3.result["state"] == {"count": 3, "s0": 0, "s1": 1, "s2": 2}
    assert at3.result["after_node"] == "s2" and at3.result["checkpoints"] == 11
    latest = await ask("state", "tt-sl")
    assert latest.result is not None and latest.result["state"]["output"] == {"count": 10}
    diff = await ask("diff", "tt-d", a=2, b=3)
    assert diff.result is not None and diff.result["diff"] == {
        "added": [["s2", 2]], "removed": [], "changed": [["count", 2, 3]]}
    found = await ask("bisect", "tt-b", predicate="count >= 5")
    assert found.result is not None
    assert (found.result["checkpoint"], found.result["after_node"]) == (5, "s4")
    never = await ask("bisect", "tt-n", predicate="count > 100")
    assert never.result is not None and never.result["checkpoint"] is None
    for command_id, verb, args in (("tt-x1", "state", {"at": 12}), ("tt-x2", "diff", {"a": 1}),
                                   ("tt-x3", "bisect", {"predicate": "count ~ 3"})):
        refused = await ask(verb, command_id, **args)
        assert not refused.ok and refused.error is not None
        assert refused.error.code == "INVALID_ARGUMENT"
    other = await admin(client, "state", command_id="tt-o", principal=VIEWER, tenant="globex",
                        task_id=task_id, args={})
    assert not other.ok and other.error is not None and other.error.code == "NOT_FOUND"
