"""Graphs are validated when registered, with errors that name the bad node, and export
their transition table and a Mermaid diagram."""

from __future__ import annotations

from typing import Any

import pytest

import ratchet
from ratchet import END, JoinPolicy
from tests.graph_apps import approve, choice


async def _noop(ctx: ratchet.StepContext) -> None:
    return None


def _wf(*build: Any) -> ratchet.Workflow:
    wf = ratchet.Workflow("bad")
    for b in build:
        b(wf)
    return wf


def _invalid(wf: ratchet.Workflow, match: str) -> None:
    with pytest.raises(ratchet.WorkflowDefinitionError, match=match):
        ratchet.Registry([wf])


def test_an_unknown_target_is_named() -> None:
    _invalid(_wf(lambda w: w.add_step("a", _noop, next="ghost")),
             r"node 'a' \(step\): unknown target 'ghost'")


def test_unreachable_nodes_are_named() -> None:
    _invalid(_wf(lambda w: w.add_step("a", _noop, next=END), lambda w: w.add_step("b", _noop)),
             r"unreachable nodes \['b'\]")


def test_a_join_without_its_fanout_is_rejected() -> None:
    def build(w: ratchet.Workflow) -> None:
        w.add_step("a", _noop, next="j")
        w.join("j", of="a")

    _invalid(_wf(build), r"node 'j' \(join\): a join without its fan-out \('a'\)")


def test_a_suspension_without_a_timeout_policy_is_rejected() -> None:
    _invalid(_wf(lambda w: w.approval("ok", on_approve=END, on_reject=END, timeout=None,
                                      on_timeout=None)),
             r"node 'ok' \(approval\): a suspension needs a timeout and on_timeout")
    _invalid(_wf(lambda w: w.wait("w", correlation=lambda s: "x", timeout=5, on_timeout=None)),
             r"node 'w' \(wait\): a suspension needs a timeout")


def test_a_routing_table_without_a_default_is_rejected() -> None:
    _invalid(_wf(lambda w: w.route("r", key=lambda s: 1, table={1: END})),
             r"node 'r' \(route\): a routing table needs a default")


def test_a_cycle_needs_a_declared_loop_bound() -> None:
    def build(bound: int | None) -> ratchet.Workflow:
        w = ratchet.Workflow("cyclic")
        w.add_step("a", _noop, next="b", max_visits=bound)
        w.choice("b", guard=lambda s: "a", targets=["a", "c"])
        w.add_step("c", _noop, next=END)
        return w

    _invalid(build(None), r"cycle a -> b -> a has no loop bound")
    ratchet.Registry([build(3)])  # bounded: accepted


def test_a_join_policy_naming_unknown_branches_is_rejected() -> None:
    branch = ratchet.Workflow("br")
    branch.add_step("x", _noop)

    def build(w: ratchet.Workflow) -> None:
        w.fanout("f", {"one": branch}, join="j")
        w.join("j", of="f", policy=JoinPolicy("required", required=frozenset({"two"})))

    _invalid(_wf(build), r"node 'j' \(join\): policy names unknown branches \['two'\]")


def test_branches_may_hold_only_steps_choices_and_routes() -> None:
    branch = ratchet.Workflow("br")
    branch.approval("human", on_approve=END, on_reject=END, timeout=5, on_timeout="cancel")

    def build(w: ratchet.Workflow) -> None:
        w.fanout("f", {"one": branch}, join="j")
        w.join("j", of="f")

    _invalid(_wf(build), r"a branch may hold only steps, choices, routes")


def test_the_transition_table_lists_every_declared_edge() -> None:
    ratchet.Registry([choice])
    assert choice.transition_table() == [
        ("assess", "step", "done", "size"),
        ("size", "choice", "guard = auto", "auto"),
        ("size", "choice", "guard = manual", "manual"),
        ("auto", "step", "done", "END"),
        ("manual", "step", "done", "END"),
    ]


def test_the_mermaid_diagram_draws_suspensions_and_their_timeouts() -> None:
    ratchet.Registry([approve])
    diagram = approve.mermaid()
    assert diagram.startswith("flowchart TD")
    assert 'n1 -->|"no decision in 3600s"| n2' in diagram
    assert 'n2 -->|"no decision in 7200s"| CANCELLED_' in diagram


def test_a_very_long_sequence_validates_without_recursion() -> None:
    wf = ratchet.Workflow("long")
    for i in range(5000):
        wf.add_step(f"s{i}", _noop)
    ratchet.Registry([wf])
    assert wf.node("s4999").successors() == [END]
