"""Wire contracts: codec, validation errors, subjects, ids, and the public facade."""

from __future__ import annotations

import time
from email.utils import formatdate

import msgpack
import pytest

import ratchet
from ratchet.protocol import (
    Envelope,
    InvalidMessage,
    SubmitTask,
    canonical,
    decode_envelope,
    encode,
    parse_body,
    task_id_for,
)
from ratchet.protocol.retry_after import retry_after_seconds
from ratchet.protocol.subjects import mail_subject, partition_of, submit_subject


def _submit_envelope(**body: object) -> Envelope:
    return Envelope(type="task.submit", message_id="m1", correlation_id="c1", body=body)


def test_an_envelope_round_trips_through_msgpack() -> None:
    env = _submit_envelope(workflow="w", input={"a": [1, 2]}, idempotency_key="k")
    again = decode_envelope(encode(env))
    assert again == env
    assert parse_body(again, SubmitTask).input == {"a": [1, 2]}


def test_a_plain_msgpack_map_from_another_language_is_accepted() -> None:
    raw = msgpack.packb({"schema_version": 1, "type": "task.submit", "message_id": "m",
                         "correlation_id": "m", "body": {"workflow": "w", "idempotency_key": "k"}})
    assert decode_envelope(raw).body["workflow"] == "w"


@pytest.mark.parametrize(
    "raw",
    [b"\xc1\xff not msgpack", msgpack.packb([1, 2, 3]), msgpack.packb({"type": "x"}),
     msgpack.packb({"schema_version": 2, "type": "t", "message_id": "m", "correlation_id": "c"})],
)
def test_undecodable_or_invalid_envelopes_raise_invalid_message(raw: bytes) -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_envelope(raw)
    assert info.value.code.value == "INVALID_ARGUMENT"


def test_a_body_that_fails_validation_names_the_field() -> None:
    env = _submit_envelope(workflow="w", idempotency_key="", input={})
    with pytest.raises(InvalidMessage) as info:
        parse_body(env, SubmitTask)
    assert info.value.details["problems"][0]["field"] == "idempotency_key"


def test_canonical_bytes_ignore_key_order() -> None:
    assert canonical({"b": 1, "a": {"y": 2, "x": 3}}) == canonical({"a": {"x": 3, "y": 2}, "b": 1})


def test_task_ids_are_deterministic_per_tenant_and_key() -> None:
    assert task_id_for("acme", "k") == task_id_for("acme", "k")
    assert task_id_for("acme", "k") != task_id_for("other", "k")


def test_partitions_are_stable_across_processes() -> None:
    # CRC-32, not Python's salted hash(): the value is fixed forever.
    assert partition_of("tsk_example", 16) == partition_of("tsk_example", 16)
    assert mail_subject("tsk_a", "task", 16).startswith(f"ratchet.mail.{partition_of('tsk_a', 16)}.")


def test_tenant_tokens_are_validated() -> None:
    with pytest.raises(InvalidMessage):
        submit_subject("acme.*")


def test_the_facade_exports_exactly_its_public_names() -> None:
    assert sorted(ratchet.__all__) == sorted([
        "Client", "TaskHandle", "TaskOutcome", "TaskError", "TaskFailed",
        "TaskBudgetExhausted", "TaskCancelled", "TaskHandedOff", "ResultTimeout",
        "NatsUnreachable", "RemoteError", "Registry", "StepContext", "Workflow", "WorkflowDefinitionError",
        "Clock", "FakeClock", "SystemClock", "ErrorCode", "IllegalTransition", "InvalidMessage",
        "NotFound", "RatchetError", "RequestConflict", "UnknownWorkflow", "Event",
        "TaskSnapshot", "TaskEvent", "TaskStatus", "transition", "Node", "NodeConfig",
        "END", "CANCEL", "FAIL", "JoinPolicy", "NodeLoops", "Reconcile", "RecordedEffect", "ActionFailed", "SandboxBlocked", "Accepted", "BreakerPolicy", "Compensation", "RetryPolicy", "Tool", "ToolContext", "tool",
        "ToolRisk", "RevalidateContext", "remote_tool", "served_by", "ToolWorker",
        "REDACTED", "SecretStr", "SecretUnreadable", "redact_log_event", "__version__",
    ])
    for name in ratchet.__all__:
        assert getattr(ratchet, name) is not None


def test_workflow_definitions_are_validated_when_built() -> None:
    wf = ratchet.Workflow("ok", version=1)

    async def a(ctx: ratchet.StepContext) -> None:
        return None

    wf.add_step("a", a)
    with pytest.raises(ratchet.WorkflowDefinitionError, match="duplicate node 'a'"):
        wf.add_step("a", a)
    with pytest.raises(ratchet.WorkflowDefinitionError, match="must be an async function"):
        wf.add_step("b", lambda ctx: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ratchet.WorkflowDefinitionError, match="has no nodes"):
        ratchet.Registry([ratchet.Workflow("empty")])


def test_inbound_subjects_are_read_by_one_parser_that_never_takes_a_longer_subject_for_a_tenant(
) -> None:
    from ratchet.protocol.subjects import is_token, mail_route, request_route, tenant_of

    assert tenant_of("ratchet.submit.acme") == "acme"
    assert tenant_of("ratchet.external") == ""
    assert tenant_of("ratchet.decisions.acme.extra") == "acme.extra"
    assert not is_token(tenant_of("ratchet.decisions.acme.extra"))
    assert request_route("ratchet.api.acme.get") == ("acme", "get")
    assert request_route("ratchet.node.n1.admin.acme.cancel") == ("acme", "cancel")
    assert request_route("ratchet.api") == ("", "")
    assert mail_route("ratchet.mail.3.tsk_x.task") == ("tsk_x", "task")
    assert mail_route("ratchet.mail.3.tsk_x") is None


def test_retry_after_is_read_as_seconds_or_an_http_date_else_the_default() -> None:
    assert retry_after_seconds({"Retry-After": "2.5"}) == 2.5
    assert retry_after_seconds({"Retry-After": "-3"}) == 0.0
    assert 50 < retry_after_seconds({"Retry-After": formatdate(time.time() + 60,
                                                               usegmt=True)}) <= 60
    assert retry_after_seconds({"Retry-After": "soon"}, default=7.0) == 7.0
    assert retry_after_seconds({}) == 1.0 and retry_after_seconds(None) == 1.0
