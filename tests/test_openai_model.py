"""The OpenAI-compatible model adapter against the real stub server (a child process)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from ratchet.actors.agents.models import Message, ModelRequest, ToolCall, ToolSpec
from ratchet.actors.agents.openai_model import OpenAICompatibleModel
from ratchet.protocol.errors import (
    ToolError,
    ToolInvalidArgument,
    ToolPermissionDenied,
    ToolRateLimited,
    ToolTransient,
)
from ratchet.testing.model_stub_process import ModelStubProcess

SECRET = "sk-test-do-not-leak-0123456789"
HELLO = ModelRequest(messages=[Message(role="user", content="hello")])
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]},
)


@pytest.fixture(scope="module")
def stub_process() -> Iterator[ModelStubProcess]:
    with ModelStubProcess() as stub:
        yield stub


@pytest.fixture
def stub(stub_process: ModelStubProcess) -> ModelStubProcess:
    stub_process.reset()
    return stub_process


@pytest.fixture
def model(stub: ModelStubProcess) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(stub.url, "gpt-test", api_key=SECRET, timeout=5.0)


def _refused_url() -> str:
    """A loopback URL on which nothing listens (the port was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def test_a_text_answer_round_trips_with_usage_and_the_reported_model_version(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.script([{"content": "hi there", "usage": {"prompt_tokens": 12, "completion_tokens": 3}}])
    assert model.version == "gpt-test"

    response = await model.complete(HELLO)

    assert response.message == Message(role="assistant", content="hi there")
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (12, 3)
    assert response.model == model.version == "gpt-test-stub"
    assert model.name == "gpt-test"
    assert response.response_id is not None and response.response_id.startswith("chatcmpl-")
    assert response.cost == 0.0
    [sent] = stub.requests()
    assert sent["authorized"] is True
    assert sent["body"]["model"] == "gpt-test"
    assert sent["body"]["messages"] == [{"role": "user", "content": "hello"}]
    assert "tools" not in sent["body"]


async def test_a_tool_call_comes_back_parsed_and_the_tools_went_out_in_openai_format(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.script([{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Zürich"}}]}])

    response = await model.complete(ModelRequest(messages=HELLO.messages, tools=[WEATHER]))

    [call] = response.message.tool_calls
    assert call.name == "get_weather" and call.arguments == {"city": "Zürich"}
    assert call.id
    assert response.message.content is None
    [sent] = stub.requests()
    assert sent["body"]["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": WEATHER.description,
        "parameters": WEATHER.parameters}}]


async def test_a_multi_turn_conversation_is_sent_in_openai_format(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    conversation = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="Weather in Oslo?"),
        Message(role="assistant", tool_calls=(ToolCall("call_1", "get_weather", {"city": "Oslo"}),)),
        Message(role="tool", content='{"temp_c": -3}', tool_call_id="call_1", name="get_weather"),
    ]

    response = await model.complete(ModelRequest(messages=conversation, tools=[WEATHER]))

    assert response.message.content == "done"  # the stub's answer once the script is empty
    messages = stub.requests()[0]["body"]["messages"]
    assert messages[:2] == [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Weather in Oslo?"}]
    assert messages[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]}
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": -3}'}


async def test_params_from_the_constructor_and_the_request_are_sent_and_no_key_means_no_header(
    stub: ModelStubProcess,
) -> None:
    model = OpenAICompatibleModel(stub.url, "gpt-test", params={"temperature": 0.0, "seed": 1})

    await model.complete(ModelRequest(messages=HELLO.messages, params={"temperature": 0.5}))

    [sent] = stub.requests()
    assert sent["authorized"] is False
    assert (sent["body"]["temperature"], sent["body"]["seed"]) == (0.5, 1)


async def test_a_429_raises_rate_limited_with_the_servers_retry_after(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.faults([{"mode": "status_429", "retry_after": 7.5}])
    with pytest.raises(ToolRateLimited) as caught:
        await model.complete(HELLO)
    assert caught.value.retry_after == 7.5
    assert caught.value.retryable


async def test_a_500_raises_transient_and_the_retry_still_gets_the_scripted_reply(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.script([{"content": "second try"}])
    stub.faults([{"mode": "status_500"}])
    with pytest.raises(ToolTransient):
        await model.complete(HELLO)
    assert (await model.complete(HELLO)).message.content == "second try"


async def test_a_malformed_body_raises_transient_saying_malformed(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.faults([{"mode": "malformed_json"}, {"mode": "no_choices"}])
    for _ in range(2):
        with pytest.raises(ToolTransient, match="malformed"):
            await model.complete(HELLO)


async def test_tool_arguments_that_are_not_json_raise_transient_saying_malformed(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.script([{"tool_calls": [{"name": "get_weather", "arguments": '{"city": "Os'}]}])
    with pytest.raises(ToolTransient, match="malformed"):
        await model.complete(HELLO)


async def test_a_400_raises_invalid_argument_with_the_servers_message(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.faults([{"mode": "status_400"}])
    with pytest.raises(ToolInvalidArgument, match="injected status_400") as caught:
        await model.complete(HELLO)
    assert not caught.value.retryable


async def test_a_401_raises_permission_denied(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    stub.faults([{"mode": "status_401"}])
    with pytest.raises(ToolPermissionDenied):
        await model.complete(HELLO)


async def test_a_refused_connection_raises_transient() -> None:
    model = OpenAICompatibleModel(_refused_url(), "gpt-test", api_key=SECRET, timeout=2.0)
    with pytest.raises(ToolTransient):
        await model.complete(HELLO)


async def test_a_server_slower_than_the_timeout_raises_transient(stub: ModelStubProcess) -> None:
    model = OpenAICompatibleModel(stub.url, "gpt-test", timeout=0.2)
    stub.faults([{"mode": "slow", "delay": 1.0}])
    with pytest.raises(ToolTransient):
        await model.complete(HELLO)


async def test_the_api_key_appears_neither_in_repr_nor_in_any_error_message(
    stub: ModelStubProcess, model: OpenAICompatibleModel
) -> None:
    assert SECRET not in repr(model) and "***" in repr(model)
    # The stub's 401 echoes the presented key, as careless providers do.
    stub.faults([{"mode": m} for m in ("status_401", "status_400", "status_500", "status_429",
                                       "malformed_json")])
    errors: list[ToolError] = []
    for _ in range(5):
        with pytest.raises(ToolError) as caught:
            await model.complete(HELLO)
        errors.append(caught.value)
    refused = OpenAICompatibleModel(_refused_url(), "gpt-test", api_key=SECRET)
    with pytest.raises(ToolError) as caught:
        await refused.complete(HELLO)
    errors.append(caught.value)
    assert "Incorrect API key provided: ***" in errors[0].message
    for error in errors:
        assert SECRET not in str(error) and SECRET not in repr(error)
        assert SECRET not in json.dumps(error.to_wire())


async def test_cost_is_computed_from_the_prices_per_thousand_tokens(
    stub: ModelStubProcess,
) -> None:
    model = OpenAICompatibleModel(stub.url, "gpt-test", prices=(0.5, 1.5))
    stub.script([{"content": "ok", "usage": {"prompt_tokens": 1000, "completion_tokens": 2000}}])
    response = await model.complete(HELLO)
    assert response.cost == pytest.approx(0.5 + 3.0)


def test_params_may_not_override_the_fields_the_adapter_owns() -> None:
    with pytest.raises(ValueError, match="messages"):
        OpenAICompatibleModel("http://127.0.0.1:1/v1", "gpt-test", params={"messages": []})
