"""OpenAIChatProvider against the loopback OpenAI peer, through the real SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
import contextlib
import gc
import socket
import sys
from typing import Any

import openai
import pytest

from custom_components.rtvoice.kernel import (
    INTERRUPTED_MARKER,
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Kernel,
)
from custom_components.rtvoice.kernel.openai_provider import (
    PLACEHOLDER_API_KEY,
    OpenAIChatProvider,
    ProviderAuthError,
    ProviderConnectionError,
    ProviderError,
    ProviderModelNotFoundError,
    ToolCallAssembler,
    build_request_body,
    message_to_openai,
    tool_to_openai,
)
from custom_components.rtvoice.kernel.types import Delta, Message, ToolCall, ToolSpec
from tests.peers.openai_server import (
    DEFAULT_MODEL,
    Drop,
    Fail,
    Hang,
    OpenAIPeer,
    Text,
    ToolCall as ScriptedToolCall,
    WaitFor,
)

# pytest-homeassistant-custom-component blocks sockets; loopback peers need them.
pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY_TIMEOUT = 10.0
USER_HI = [Message(role="user", content="hi")]


@pytest.fixture
async def peer() -> AsyncIterator[OpenAIPeer]:
    """Start an OpenAI-compatible peer."""
    async with OpenAIPeer() as started:
        yield started


@pytest.fixture
async def provider(peer: OpenAIPeer) -> AsyncIterator[OpenAIChatProvider]:
    """Create a provider pointed at the peer."""
    chat = OpenAIChatProvider(
        base_url=peer.base_url,
        api_key=None,
        model=DEFAULT_MODEL,
        timeout=SAFETY_TIMEOUT,
    )
    yield chat
    await chat.close()


async def collect(
    provider: OpenAIChatProvider,
    messages: list[Message] = USER_HI,
    tools: list[ToolSpec] | None = None,
) -> list[Delta]:
    """Consume a whole stream."""
    return [delta async for delta in provider.stream(messages, tools or [])]


def free_port() -> int:
    """Return a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- streaming -------------------------------------------------------------------


async def test_text_deltas_arrive_one_by_one(
    peer: OpenAIPeer, provider: OpenAIChatProvider
) -> None:
    """Each text delta is yielded before the server sends the next one."""
    first_seen, second_seen = asyncio.Event(), asyncio.Event()
    peer.enqueue(
        Text("Hello"),
        WaitFor(first_seen),
        Text(", wor"),
        WaitFor(second_seen),
        Text("ld"),
    )
    stream = provider.stream(USER_HI, [])
    first = await asyncio.wait_for(anext(stream), SAFETY_TIMEOUT)
    assert first == Delta(content="Hello")
    first_seen.set()
    second = await asyncio.wait_for(anext(stream), SAFETY_TIMEOUT)
    assert second == Delta(content=", wor")
    second_seen.set()
    rest = [delta async for delta in stream]
    assert rest == [Delta(content="ld")]
    record = peer.requests[0]
    assert record.completed
    assert not record.disconnected.is_set()
    assert record.headers["Authorization"] == f"Bearer {PLACEHOLDER_API_KEY}"


async def test_fragmented_parallel_tool_calls_are_assembled(
    peer: OpenAIPeer, provider: OpenAIChatProvider
) -> None:
    """Fragments of two calls become two whole calls, delivered once at the end."""
    peer.enqueue(
        Text("Turning on."),
        ScriptedToolCall(
            "call_1", "light_turn_on", '{"area": "kitchen", "level": 80}', fragments=4
        ),
        ScriptedToolCall("call_2", "media_pause", '{"player": "tv"}', fragments=3),
    )
    deltas = await collect(provider)
    assert deltas == [
        Delta(content="Turning on."),
        Delta(
            tool_calls=[
                ToolCall("call_1", "light_turn_on", {"area": "kitchen", "level": 80}),
                ToolCall("call_2", "media_pause", {"player": "tv"}),
            ]
        ),
    ]


@pytest.mark.parametrize(
    ("raw_arguments", "expected_error"),
    [
        ('{"area": "kit', "invalid JSON arguments: "),
        ('["kitchen"]', "invalid JSON arguments: expected an object, got list"),
    ],
)
async def test_bad_tool_arguments_become_call_errors(
    peer: OpenAIPeer,
    provider: OpenAIChatProvider,
    raw_arguments: str,
    expected_error: str,
) -> None:
    """Arguments that are not a JSON object set ToolCall.error; nothing raises."""
    peer.enqueue(
        ScriptedToolCall("call_bad", "light_turn_on", raw_arguments, fragments=2),
        ScriptedToolCall("call_empty", "get_time", ""),
    )
    deltas = await collect(provider)
    assert len(deltas) == 1
    bad, empty = deltas[0].tool_calls or []
    assert (bad.id, bad.name, bad.arguments) == ("call_bad", "light_turn_on", {})
    assert bad.error is not None
    assert bad.error.startswith(expected_error)
    assert empty == ToolCall("call_empty", "get_time", {})


def test_assembler_edge_fragments() -> None:
    """Fragments without an index continue the last call; a new id is a new call.

    Some servers send follow-up fragments without an index, or reuse an index for
    the next call; a call without a function name becomes a call error.
    """
    assembler = ToolCallAssembler()
    assembler.add(index=0, call_id="c1", name="light_on", arguments='{"area": ')
    assembler.add(index=None, call_id=None, name=None, arguments='"kitchen"}')
    assembler.add(index=0, call_id="c2", name="media_pause", arguments="{}")
    assembler.add(index=1, call_id="c3", name=None, arguments="{}")
    assert assembler.finish() == [
        ToolCall("c1", "light_on", {"area": "kitchen"}),
        ToolCall("c2", "media_pause", {}),
        ToolCall("c3", "", {}, error="tool call without a function name"),
    ]


async def test_provider_names_its_model() -> None:
    """The model property is the configured model id."""
    provider = OpenAIChatProvider(
        base_url="http://127.0.0.1:9/v1", api_key=None, model="llama3.2"
    )
    assert provider.model == "llama3.2"
    await provider.close()


async def test_messages_and_tools_are_sent_in_openai_shape(
    peer: OpenAIPeer, peer_provider_with_temperature: OpenAIChatProvider
) -> None:
    """History with a tool group round-trips into the request body the peer saw."""
    messages = [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Kitchen light on"),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall("call_1", "light_turn_on", {"area": "Küche", "level": 80}),
                ToolCall("call_2", "get_time", {}),
            ],
        ),
        Message(role="tool", content='{"ok": true}', tool_call_id="call_1"),
        Message(role="tool", content="12:00", tool_call_id="call_2"),
        Message(role="assistant", content="Done, it is no", interrupted=True),
        Message(role="user", content="thanks"),
    ]
    tools = [
        ToolSpec(
            name="light_turn_on",
            description="Turn on a light",
            parameters={"type": "object", "properties": {"area": {"type": "string"}}},
        ),
        ToolSpec(name="get_time", description="", parameters={}),
    ]
    await collect(peer_provider_with_temperature, messages, tools)
    await collect(peer_provider_with_temperature, USER_HI, [])

    with_tools, without_tools = peer.requests
    assert with_tools.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Kitchen light on"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "light_turn_on",
                        "arguments": '{"area": "Küche", "level": 80}',
                    },
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
        {"role": "assistant", "content": "Done, it is no"},
        {"role": "user", "content": "thanks"},
    ]
    assert with_tools.tools == [
        {
            "type": "function",
            "function": {
                "name": "light_turn_on",
                "description": "Turn on a light",
                "parameters": {
                    "type": "object",
                    "properties": {"area": {"type": "string"}},
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert with_tools.body["stream"] is True
    assert with_tools.body["model"] == DEFAULT_MODEL
    assert with_tools.body["temperature"] == 0.25
    assert "tools" not in without_tools.body


def shapes() -> tuple[list[Message], list[ToolSpec]]:
    """Every message and tool shape the kernel sends."""
    messages = [
        Message(role="system", content="You are terse.\nSections: ..."),
        Message(role="user", content="Küche an, bitte 🙂"),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall("call_1", "HassTurnOn", {"area": "Küche", "level": [1, 2.5]}),
                ToolCall("call_2", "GetLiveContext", {}),
            ],
        ),
        Message(role="tool", content='{"success": true}', tool_call_id="call_1"),
        Message(role="tool", content="", tool_call_id="call_2"),
        Message(
            role="assistant",
            content="One moment.",
            tool_calls=[ToolCall("call_3", "HassLightSet", {"brightness": 50})],
        ),
        Message(role="tool", content="null", tool_call_id="call_3"),
        Message(role="assistant", content="Done, it is no", interrupted=True),
        Message(role="user", content="thanks"),
        Message(role="assistant", content=""),
    ]
    tools = [
        ToolSpec(
            name="HassTurnOn",
            description="Turns on/opens a device or entity",
            parameters={
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "domain": {"type": "array", "items": {"type": "string"}},
                },
                "required": [],
            },
        ),
        ToolSpec(name="GetLiveContext", description="", parameters={}),
    ]
    return messages, tools


@pytest.mark.parametrize("temperature", [None, 0.25])
@pytest.mark.parametrize("with_tools", [True, False])
async def test_request_body_equals_the_typed_sdk_path(
    peer: OpenAIPeer, temperature: float | None, with_tools: bool
) -> None:
    """What the provider sends is what ``chat.completions.create`` sends.

    The same request goes out twice, through the SDK's typed path (which transforms
    the params through its TypedDicts) and through the provider; the peer records
    both bodies, which must be equal JSON, for this installed openai release.
    """
    messages, tools = shapes()
    if not with_tools:
        tools = []
    typed: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "messages": [message_to_openai(m) for m in messages],
        "stream": True,
    }
    if tools:
        typed["tools"] = [tool_to_openai(t) for t in tools]
    if temperature is not None:
        typed["temperature"] = temperature
    client = openai.AsyncOpenAI(
        base_url=peer.base_url, api_key=PLACEHOLDER_API_KEY, max_retries=0
    )
    try:
        async for _chunk in await client.chat.completions.create(**typed):
            pass
    finally:
        await client.close()
    chat = OpenAIChatProvider(
        base_url=peer.base_url,
        api_key=None,
        model=DEFAULT_MODEL,
        temperature=temperature,
        timeout=SAFETY_TIMEOUT,
    )
    try:
        await collect(chat, messages, tools)
        await collect(chat, messages, tools)  # second time from the cache
    finally:
        await chat.close()

    sdk_request, ours, ours_cached = peer.requests
    assert ours.body == sdk_request.body
    assert ours_cached.body == sdk_request.body
    assert ours.headers["Authorization"] == sdk_request.headers["Authorization"]
    assert ours.headers["Content-Type"] == sdk_request.headers["Content-Type"]
    assert ("tools" in ours.body) is with_tools
    assert ("temperature" in ours.body) is (temperature is not None)


def test_wire_dicts_are_cached_per_message() -> None:
    """An unchanged message is converted once; its dict is reused by identity."""
    messages, tools = shapes()
    first = build_request_body("m", messages, tools)
    second = build_request_body("m", messages, tools)
    assert first == second
    assert all(
        a is b for a, b in zip(first["messages"], second["messages"], strict=True)
    )
    assert first["messages"] == [message_to_openai(m) for m in messages]
    # An equal message that is another object converts on its own.
    copied = Message(role="user", content="Küche an, bitte 🙂")
    assert build_request_body("m", [copied], [])["messages"] == [first["messages"][1]]


def test_an_edited_message_is_not_served_stale() -> None:
    """Messages are mutable dataclasses: every edit invalidates the cached dict."""
    call = ToolCall("call_1", "HassTurnOn", {"name": "kitchen", "area": {"floor": 1}})
    message = Message(role="assistant", content="On it.", tool_calls=[call])
    tool = Message(role="tool", content="ok", tool_call_id="call_1")
    history = [message, tool]

    def sent() -> list[dict[str, Any]]:
        wire: list[dict[str, Any]] = build_request_body("m", history, [])["messages"]
        assert wire == [message_to_openai(m) for m in history]
        return wire

    sent()
    message.content = "Right away."
    assert sent()[0]["content"] == "Right away."
    call.arguments["area"]["floor"] = 2  # nested, in place
    assert '"floor": 2' in sent()[0]["tool_calls"][0]["function"]["arguments"]
    call.name = "HassTurnOff"
    assert sent()[0]["tool_calls"][0]["function"]["name"] == "HassTurnOff"
    message.tool_calls.append(ToolCall("call_2", "GetLiveContext", {}))
    assert len(sent()[0]["tool_calls"]) == 2
    message.tool_calls = None
    assert "tool_calls" not in sent()[0]
    message.role = "user"
    assert sent()[0]["role"] == "user"
    tool.tool_call_id = "call_9"
    assert sent()[1]["tool_call_id"] == "call_9"
    tool.content = "done"
    assert sent()[1]["content"] == "done"


@pytest.fixture
async def peer_provider_with_temperature(
    peer: OpenAIPeer,
) -> AsyncIterator[OpenAIChatProvider]:
    """Create a provider with a temperature set."""
    chat = OpenAIChatProvider(
        base_url=peer.base_url,
        api_key="",
        model=DEFAULT_MODEL,
        temperature=0.25,
        timeout=SAFETY_TIMEOUT,
    )
    yield chat
    await chat.close()


# -- closing and cancelling -------------------------------------------------------


async def test_aclose_mid_stream_hangs_up(
    peer: OpenAIPeer, provider: OpenAIChatProvider
) -> None:
    """Closing the iterator closes the HTTP response: the server sees the hang-up."""
    never = asyncio.Event()
    peer.enqueue(Text("Once upon"), WaitFor(never), Text(" a time"))
    stream = provider.stream(USER_HI, [])
    assert await asyncio.wait_for(anext(stream), SAFETY_TIMEOUT) == Delta("Once upon")
    await stream.aclose()
    record = peer.requests[0]
    await asyncio.wait_for(record.disconnected.wait(), SAFETY_TIMEOUT)
    assert not record.completed


async def test_aclose_returns_after_the_hang_up_reached_the_server(
    peer: OpenAIPeer, provider: OpenAIChatProvider
) -> None:
    """When ``aclose`` returns, the server's socket already has the hang-up.

    So nothing the caller does next (building the next request) delays it.
    """
    peer.enqueue(Text("Once upon"), WaitFor(asyncio.Event()))
    stream = provider.stream(USER_HI, [])
    assert await asyncio.wait_for(anext(stream), SAFETY_TIMEOUT) == Delta("Once upon")
    record = peer.requests[0]
    assert not record.hang_up_arrived()
    await stream.aclose()
    assert record.hang_up_arrived()


class _CheckingProvider(OpenAIChatProvider):
    """Notes, when each request is started, whether the previous one was hung up."""

    def __init__(self, peer: OpenAIPeer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.peer = peer
        self.hung_up_before_next: list[bool] = []

    def stream(  # type: ignore[override]
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncGenerator[Delta]:
        if self.peer.requests:
            self.hung_up_before_next.append(self.peer.requests[-1].hang_up_arrived())
        return super().stream(messages, tools)


async def test_kernel_barge_ins_through_http(peer: OpenAIPeer) -> None:
    """Kernel + provider + peer: each barge-in hangs up before the next request.

    Every request carries the whole grown history (with a tool group), and the
    previous response's connection is closed before the next one is even built.
    """
    never = asyncio.Event()
    peer.enqueue(ScriptedToolCall("call_1", "get_time", "{}"))
    peer.enqueue(Text("It is noon"), Text(", and"))  # completes
    peer.default_reply(Text("Well"), WaitFor(never))
    provider = _CheckingProvider(
        peer, base_url=peer.base_url, api_key=None, model=DEFAULT_MODEL
    )

    class Clock:
        def specs(self) -> list[ToolSpec]:
            return [ToolSpec("get_time", "Tell the time", {})]

        async def call(self, call: ToolCall) -> str:
            return '"12:00"'

    channels = ChannelRegistry()
    kernel = Kernel(provider, channels, tools=Clock())
    deltas: list[str] = []
    got_delta = asyncio.Event()

    def on_delta(text: str) -> None:
        deltas.append(text)
        got_delta.set()

    realtime = ChannelDef(realtime=True)
    channels.register_input("c:in", realtime)
    channels.register_output("c:out", on_delta, definition=realtime)
    await kernel.spawn(ChildOptions("c", "c:in", "c:out"))
    try:
        first = await asyncio.wait_for(
            kernel.push("c", "what time is it").outcome, SAFETY_TIMEOUT
        )
        assert first.status == "completed"
        assert first.text == "It is noon, and"
        tickets = []
        for trial in range(5):
            got_delta.clear()
            tickets.append(kernel.push("c", f"input {trial}"))
            await asyncio.wait_for(got_delta.wait(), SAFETY_TIMEOUT)
        got_delta.clear()
        tickets.append(kernel.push("c", "last"))
        await asyncio.wait_for(got_delta.wait(), SAFETY_TIMEOUT)
        for ticket in tickets[:-1]:
            outcome = await asyncio.wait_for(ticket.outcome, SAFETY_TIMEOUT)
            assert outcome.status == "interrupted"
    finally:
        await kernel.stop_all()
        await provider.close()

    # Requests 1 and 2 completed (whether their connection is kept alive depends on
    # the openai release), 3 to 7 were cut.
    assert len(provider.hung_up_before_next) == 7
    assert provider.hung_up_before_next[2:] == [True] * 5
    assert all(record.disconnected.is_set() for record in peer.requests[2:-1])
    last = peer.requests[-1].messages
    assert [m["role"] for m in last[:6]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert last[2]["tool_calls"][0]["function"]["name"] == "get_time"
    assert last[3] == {"role": "tool", "tool_call_id": "call_1", "content": '"12:00"'}
    assert last[-2:] == [
        {"role": "assistant", "content": "Well" + INTERRUPTED_MARKER},
        {"role": "user", "content": "last"},
    ]
    assert len(last) == 6 + 2 * 5


async def test_cancelling_the_consumer_hangs_up(
    peer: OpenAIPeer, provider: OpenAIChatProvider
) -> None:
    """Cancelling a task that is reading the stream closes the HTTP response."""
    never = asyncio.Event()
    peer.enqueue(Text("Once upon"), WaitFor(never), Text(" a time"))
    received: list[Delta] = []
    first_delta = asyncio.Event()

    async def consume() -> None:
        async for delta in provider.stream(USER_HI, []):
            received.append(delta)
            first_delta.set()

    consumer = asyncio.create_task(consume())
    await asyncio.wait_for(first_delta.wait(), SAFETY_TIMEOUT)
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    record = peer.requests[0]
    await asyncio.wait_for(record.disconnected.wait(), SAFETY_TIMEOUT)
    assert received == [Delta("Once upon")]


async def test_cancelling_before_headers_hangs_up(
    peer: OpenAIPeer, provider: OpenAIChatProvider
) -> None:
    """Cancelled while waiting for the response headers: the server sees it too."""
    peer.enqueue(WaitFor(asyncio.Event()))
    consumer = asyncio.create_task(collect(provider))
    record = await asyncio.wait_for(peer.wait_for_request(1), SAFETY_TIMEOUT)
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    await asyncio.wait_for(record.disconnected.wait(), SAFETY_TIMEOUT)


# -- failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "error_type", "text_before_error"),
    [
        ((Fail(500, "server exploded"),), ProviderConnectionError, []),
        ((Fail(503, "overloaded"),), ProviderConnectionError, []),
        ((Fail(429, "slow down"),), ProviderError, []),
        ((Text("par"), Drop()), ProviderConnectionError, ["par"]),
        ((Text("par"), Fail(500, "mid-stream")), ProviderError, ["par"]),
    ],
    ids=["http500", "http503", "http429", "drop", "sse-error"],
)
async def test_provider_failures_raise_provider_errors(
    peer: OpenAIPeer,
    provider: OpenAIChatProvider,
    script: tuple,
    error_type: type[ProviderError],
    text_before_error: list[str],
) -> None:
    """HTTP errors and broken streams surface as ProviderError subclasses."""
    peer.enqueue(*script)
    received: list[str] = []

    async def consume() -> None:
        async for delta in provider.stream(USER_HI, []):
            received.append(delta.content)  # noqa: PERF401 - keep what came before the error

    with pytest.raises(error_type) as caught:
        await consume()
    assert received == text_before_error
    if isinstance(script[-1], Fail):
        assert script[-1].message in str(caught.value)


async def test_wrong_key_is_an_auth_error_without_the_key() -> None:
    """401 becomes ProviderAuthError; the message does not reveal the key."""
    async with OpenAIPeer(api_key="right-key") as peer:
        chat = OpenAIChatProvider(
            base_url=peer.base_url, api_key="sk-wrong-secret", model=DEFAULT_MODEL
        )
        try:
            with pytest.raises(ProviderAuthError) as caught:
                await collect(chat)
        finally:
            await chat.close()
    assert "sk-wrong-secret" not in str(caught.value)
    assert "401" in str(caught.value)


async def test_unknown_model_is_model_not_found(peer: OpenAIPeer) -> None:
    """A 404 for the model becomes ProviderModelNotFoundError."""
    chat = OpenAIChatProvider(base_url=peer.base_url, api_key=None, model="gpt-nope")
    try:
        with pytest.raises(ProviderModelNotFoundError, match="gpt-nope"):
            await collect(chat)
    finally:
        await chat.close()


@pytest.mark.parametrize(
    "script",
    [(Hang(),), (Text("still thinking"), Hang())],
    ids=["before-headers", "mid-stream"],
)
async def test_silent_server_times_out(peer: OpenAIPeer, script: tuple) -> None:
    """A server that stops sending fails after the provider's timeout."""
    peer.enqueue(*script)
    chat = OpenAIChatProvider(
        base_url=peer.base_url, api_key=None, model=DEFAULT_MODEL, timeout=0.2
    )
    try:
        with pytest.raises(ProviderConnectionError, match="timed out"):
            await asyncio.wait_for(collect(chat), SAFETY_TIMEOUT)
    finally:
        await chat.close()


async def test_nothing_listening_is_a_connection_error() -> None:
    """Connection refused becomes ProviderConnectionError."""
    chat = OpenAIChatProvider(
        base_url=f"http://127.0.0.1:{free_port()}/v1", api_key=None, model=DEFAULT_MODEL
    )
    try:
        with pytest.raises(ProviderConnectionError):
            await collect(chat)
    finally:
        await chat.close()


# -- validate ------------------------------------------------------------------------


async def test_validate_accepts_a_good_endpoint() -> None:
    """Reachable endpoint, accepted key, known model: no error, no chat request."""
    async with OpenAIPeer(api_key="right-key") as peer:
        chat = OpenAIChatProvider(
            base_url=peer.base_url, api_key="right-key", model=DEFAULT_MODEL
        )
        try:
            await chat.validate()
        finally:
            await chat.close()
        assert peer.requests == []


@pytest.mark.parametrize(
    ("api_key", "model", "error_type"),
    [
        ("wrong-key", DEFAULT_MODEL, ProviderAuthError),
        (None, DEFAULT_MODEL, ProviderAuthError),
        ("right-key", "gpt-nope", ProviderModelNotFoundError),
    ],
    ids=["wrong-key", "missing-key", "unknown-model"],
)
async def test_validate_rejects(
    api_key: str | None, model: str, error_type: type[ProviderError]
) -> None:
    """Bad key and unknown model are told apart."""
    async with OpenAIPeer(api_key="right-key") as peer:
        chat = OpenAIChatProvider(base_url=peer.base_url, api_key=api_key, model=model)
        try:
            with pytest.raises(error_type):
                await chat.validate()
        finally:
            await chat.close()


async def test_validate_nothing_listening() -> None:
    """No server on the port: ProviderConnectionError."""
    chat = OpenAIChatProvider(
        base_url=f"http://127.0.0.1:{free_port()}/v1", api_key=None, model=DEFAULT_MODEL
    )
    try:
        with pytest.raises(ProviderConnectionError):
            await chat.validate()
    finally:
        await chat.close()


async def test_validate_without_models_route_probes_chat() -> None:
    """Servers without /models are checked with a one-token completion."""
    async with OpenAIPeer(serve_models=False) as peer:
        good = OpenAIChatProvider(
            base_url=peer.base_url, api_key=None, model=DEFAULT_MODEL
        )
        unknown = OpenAIChatProvider(
            base_url=peer.base_url, api_key=None, model="gpt-nope"
        )
        try:
            await good.validate()
            probe = peer.requests[-1]
            assert probe.body["max_tokens"] == 1
            assert not probe.stream
            with pytest.raises(ProviderModelNotFoundError):
                await unknown.validate()
            peer.enqueue(Fail(502, "bad gateway"))
            with pytest.raises(ProviderConnectionError):
                await good.validate()
        finally:
            await good.close()
            await unknown.close()


# -- leftovers ---------------------------------------------------------------------


@contextlib.contextmanager
def record_finalized_generators() -> Iterator[list[AsyncGenerator[Any, Any]]]:
    """Record async generators that end up finalised by the garbage collector.

    A finalised generator makes the event loop spawn an ``aclose`` task at whatever
    moment the collector runs: in Home Assistant tests that is a lingering task in
    some unrelated test. Use inside the running loop (it installs its hooks on
    start, so hooks set before would be replaced).
    """
    hooks = sys.get_asyncgen_hooks()
    finalized: list[AsyncGenerator[Any, Any]] = []

    def finalizer(generator: AsyncGenerator[Any, Any]) -> None:
        finalized.append(generator)
        if hooks.finalizer is not None:
            hooks.finalizer(generator)

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        yield finalized
    finally:
        sys.set_asyncgen_hooks(*hooks)


@pytest.mark.parametrize("how", ["aclose", "cancel"])
async def test_closing_leaves_nothing_for_the_garbage_collector(
    peer: OpenAIPeer,
    provider: OpenAIChatProvider,
    how: str,
) -> None:
    """After an early close no suspended SDK/httpx generator is left behind."""
    peer.enqueue(Text("Once upon"), WaitFor(asyncio.Event()))
    first_delta = asyncio.Event()

    async def consume() -> None:
        stream = provider.stream(USER_HI, [])
        try:
            async for _delta in stream:
                first_delta.set()
                if how == "aclose":
                    break
        finally:
            await stream.aclose()

    with record_finalized_generators() as finalized:
        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(first_delta.wait(), SAFETY_TIMEOUT)
        if how == "cancel":
            consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await asyncio.wait_for(peer.requests[0].disconnected.wait(), SAFETY_TIMEOUT)
        del consumer
        gc.collect()
    assert finalized == []
