"""The remote tool wire (protocol/tool_wire.py) and declarations (remote_tools.py), no I/O."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, SecretStr

import ratchet
from ratchet.actors.workflow.tools import Decision, classify
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import (
    InvalidMessage,
    ToolDefinitionError,
    ToolOutcomeUnknown,
    ToolRateLimited,
    ToolTransient,
)
from ratchet.protocol.subjects import (
    tool_durable,
    tool_reply_route,
    tool_reply_subject,
    tool_subject,
)
from ratchet.protocol.tool_wire import (
    ToolReplyError,
    decode_reply,
    decode_request,
    error_of_exception,
    exception_of_error,
    request_msg_id,
    revealed,
)


class Args(BaseModel):
    x: int


def _request(**over: object) -> dict[str, object]:
    return {"schema_version": 1, "correlation_id": "tcl_1", "task_id": "tsk_1",
            "tenant": "acme", "tool": "pay", "op": "call", "args": {"x": 1},
            "idempotency_key": "k", "attempt": 1, "deadline": 1.5,
            "reply_to": "ratchet.toolreply.acme.n1-ab", **over}


def test_a_request_round_trips_and_hostile_ones_are_typed_errors() -> None:
    assert decode_request(encode(_request())).idempotency_key == "k"
    for bad in (b"\xc1", encode([1]), encode(_request(op="delete")),
                encode(_request(attempt="1")), encode(_request(extra=1)),
                b"\x00" * (1024 * 1024 + 1)):
        with pytest.raises(InvalidMessage):
            decode_request(bad)


def test_a_reply_must_say_ok_and_echo_its_correlation_id() -> None:
    assert decode_reply(encode({"correlation_id": "c", "ok": True, "result": None})).ok
    with pytest.raises(InvalidMessage):
        decode_reply(encode({"correlation_id": "c", "ok": "yes"}))
    with pytest.raises(InvalidMessage):
        decode_reply(encode({"ok": True}))


def test_message_ids_let_a_deliberate_resend_and_every_query_through() -> None:
    assert request_msg_id("k", 1, "call", "c1") == request_msg_id("k", 1, "call", "c2")
    assert request_msg_id("k", 1, "call", "c1") != request_msg_id("k", 2, "call", "c1")
    assert request_msg_id("k", 1, "query", "c1") != request_msg_id("k", 1, "query", "c2")
    assert request_msg_id(None, 1, "call", "c1") == "read:c1"


def test_reply_codes_map_to_the_retry_policy_both_ways() -> None:
    def decision(code: str) -> Decision:
        return classify(exception_of_error(ToolReplyError(code=code), "t"), "write")

    assert decision("INVALID_ARGUMENT") is Decision.FAIL
    assert decision("UNAVAILABLE") is Decision.BACKOFF
    assert decision("RATE_LIMITED") is Decision.RETRY_AFTER
    assert decision("OUTCOME_UNKNOWN") is Decision.UNKNOWN
    assert decision("SOMETHING_NEW") is Decision.UNKNOWN  # unknown codes are never resent
    assert isinstance(exception_of_error(None, "t"), ToolOutcomeUnknown)
    assert error_of_exception(ToolTransient("down")).code == "UNAVAILABLE"
    assert error_of_exception(ToolRateLimited("slow", retry_after=2)).retry_after == 2.0
    assert error_of_exception(ValueError("?")).code == "OUTCOME_UNKNOWN"


def test_subjects_and_consumer_names_carry_tenant_and_tool() -> None:
    assert tool_subject("acme", "pay") == "ratchet.tools.acme.pay"
    assert tool_durable("acme", "pay") == "tools-acme-pay"
    assert tool_reply_route(tool_reply_subject("acme", "n1-ab")) == "acme"
    assert tool_reply_route("ratchet.toolreply.acme.n1.extra") is None
    with pytest.raises(InvalidMessage):
        tool_subject("acme", "a.b")


def test_secrets_travel_in_clear_in_a_request_only() -> None:
    assert revealed({"token": SecretStr("s3"), "list": [SecretStr("a")]}) == {
        "token": "s3", "list": ["a"]}


def test_a_remote_tool_is_declared_without_code_and_served_with_it() -> None:
    declared = ratchet.remote_tool("pay", kind="write", args=Args, result=Args,
                                   key=lambda a: f"k:{a.x}", has_query=True)
    assert declared.remote and declared.query is not None
    served = ratchet.served_by(declared, lambda ctx, a: a, lambda ctx, a: None)
    assert served.remote and served.name == "pay"
    with pytest.raises(ToolDefinitionError, match="query"):
        ratchet.served_by(declared, lambda ctx, a: a)
    with pytest.raises(ToolDefinitionError, match="remote tool's name"):
        ratchet.remote_tool("a.b", kind="read", args=Args, result=Args)
