"""Tests of the loopback OpenAI-compatible peer itself, driven by raw HTTP (httpx)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import json
import socket
from typing import Any

import httpx
import pytest

from tests.peers.openai_server import (
    DEFAULT_MODEL,
    Delay,
    Drop,
    Fail,
    Hang,
    OpenAIPeer,
    Step,
    Text,
    ToolCall,
    WaitFor,
)

# pytest-homeassistant-custom-component blocks sockets; loopback peers need them.
pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY_TIMEOUT = 10.0


@pytest.fixture
async def peer() -> AsyncIterator[OpenAIPeer]:
    """Start a peer."""
    async with OpenAIPeer() as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """Open a plain HTTP client."""
    async with httpx.AsyncClient(timeout=SAFETY_TIMEOUT) as client:
        yield client


def chat_body(**extra: Any) -> dict[str, Any]:
    """Build a minimal streaming chat request body."""
    return {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        **extra,
    }


async def read_events(response: httpx.Response) -> list[str]:
    """Read every SSE ``data:`` payload of a streamed response."""
    return [
        line.removeprefix("data: ")
        async for line in response.aiter_lines()
        if line.startswith("data: ")
    ]


async def test_streams_chunks_in_openai_shape(
    peer: OpenAIPeer, http: httpx.AsyncClient
) -> None:
    """Text and tool-call steps become real chat.completion.chunk events."""
    peer.enqueue(
        Text("Hel"),
        Text("lo"),
        ToolCall("call_a", "light_on", '{"area": "kitchen"}', fragments=3),
        ToolCall("call_b", "light_off", "{}"),
    )
    async with http.stream(
        "POST", f"{peer.base_url}/chat/completions", json=chat_body()
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = await read_events(response)

    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert [d["content"] for d in deltas[1:3]] == ["Hel", "lo"]
    fragments = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert [f["index"] for f in fragments] == [0, 0, 0, 1]
    assert fragments[0]["id"] == "call_a"
    assert fragments[0]["function"]["name"] == "light_on"
    assert "id" not in fragments[1]
    assert "".join(f["function"]["arguments"] for f in fragments[:3]) == (
        '{"area": "kitchen"}'
    )
    assert fragments[3]["id"] == "call_b"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert peer.requests[0].completed
    assert not peer.requests[0].disconnected.is_set()


async def test_default_reply_and_fifo(
    peer: OpenAIPeer, http: httpx.AsyncClient
) -> None:
    """Scripts answer requests in order; the default answers the rest."""
    peer.enqueue(Text("first"))
    peer.default_reply(Text("fallback"))
    texts = []
    for _ in range(2):
        response = await http.post(
            f"{peer.base_url}/chat/completions", json=chat_body(stream=False)
        )
        message = response.json()["choices"][0]["message"]
        texts.append(message["content"])
        assert response.json()["choices"][0]["finish_reason"] == "stop"
    assert texts == ["first", "fallback"]
    assert peer.pending_scripts == 0


async def test_auth_and_unknown_model() -> None:
    """A wrong key gets 401; an unknown model 404, on chat and on /models/{id}."""
    async with (
        OpenAIPeer(api_key="sekrit") as peer,
        httpx.AsyncClient(timeout=SAFETY_TIMEOUT) as http,
    ):
        good = {"Authorization": "Bearer sekrit"}
        bad = {"Authorization": "Bearer nope"}
        url = f"{peer.base_url}/chat/completions"
        response = await http.post(url, json=chat_body(), headers=bad)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        response = await http.post(url, json=chat_body(model="nope"), headers=good)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
        models = f"{peer.base_url}/models"
        assert (await http.get(f"{models}/nope", headers=good)).status_code == 404
        assert (
            await http.get(f"{models}/{DEFAULT_MODEL}", headers=bad)
        ).status_code == (401)
        listed = (await http.get(models, headers=good)).json()
        assert [model["id"] for model in listed["data"]] == [DEFAULT_MODEL]
        assert [request.status for request in peer.requests] == [401, 404]


async def test_fail_before_and_after_streaming_started(
    peer: OpenAIPeer, http: httpx.AsyncClient
) -> None:
    """Fail is an HTTP status before any output, an SSE error event after."""
    peer.enqueue(Fail(503, "overloaded"))
    peer.enqueue(Text("partial"), Fail(500, "boom"))
    url = f"{peer.base_url}/chat/completions"
    response = await http.post(url, json=chat_body())
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "overloaded"

    async with http.stream("POST", url, json=chat_body()) as response:
        events = await read_events(response)
    assert json.loads(events[-1]) == {
        "error": {
            "message": "boom",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert "[DONE]" not in events


async def test_drop_breaks_the_body(peer: OpenAIPeer, http: httpx.AsyncClient) -> None:
    """Drop closes the connection mid-stream; that is no client hang-up."""
    peer.enqueue(Text("partial"), Drop())
    with pytest.raises(httpx.RemoteProtocolError):
        async with http.stream(
            "POST", f"{peer.base_url}/chat/completions", json=chat_body()
        ) as response:
            await read_events(response)
    record = peer.requests[0]
    assert record.dropped_by_peer
    assert not record.completed
    assert not record.disconnected.is_set()


async def send_raw_chat(
    peer: OpenAIPeer, body: dict[str, Any]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a chat request over a bare TCP connection (full control of hang-ups)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", peer.port)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"Host: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("pause", ["delay", "wait_for", "hang"])
async def test_client_hangup_is_seen_during_a_pause(
    peer: OpenAIPeer, pause: str
) -> None:
    """A client that hangs up while the script pauses is recorded at once."""
    never = asyncio.Event()
    steps: dict[str, Step] = {
        "delay": Delay(3600),
        "wait_for": WaitFor(never),
        "hang": Hang(),
    }
    step = steps[pause]
    peer.enqueue(Text("first"), step, Text("never sent"))
    reader, writer = await send_raw_chat(peer, chat_body())
    received = await asyncio.wait_for(reader.readuntil(b'"first"'), SAFETY_TIMEOUT)
    assert received.startswith(b"HTTP/1.1 200 OK")
    writer.close()
    await writer.wait_closed()
    record = await asyncio.wait_for(peer.wait_for_request(1), SAFETY_TIMEOUT)
    await asyncio.wait_for(record.disconnected.wait(), SAFETY_TIMEOUT)
    assert record.disconnected_at is not None
    assert record.disconnected_at >= record.received_at
    assert not record.completed


async def test_hang_up_arrived_is_checked_without_the_loop(peer: OpenAIPeer) -> None:
    """``hang_up_arrived`` sees a closed client socket before the handler does."""
    peer.enqueue(Text("first"), WaitFor(asyncio.Event()))
    reader, writer = await send_raw_chat(peer, chat_body())
    await asyncio.wait_for(reader.readuntil(b'"first"'), SAFETY_TIMEOUT)
    record = peer.requests[0]
    assert not record.hang_up_arrived()
    raw = writer.get_extra_info("socket")
    # Shut the client side down directly: no event-loop iteration runs before the
    # check, so only the server's socket can tell.
    raw.shutdown(socket.SHUT_WR)
    assert not record.disconnected.is_set()
    assert record.hang_up_arrived()
    writer.close()
    await writer.wait_closed()
    await asyncio.wait_for(record.disconnected.wait(), SAFETY_TIMEOUT)
    assert record.hang_up_arrived()


async def test_hangup_before_headers_is_seen(
    peer: OpenAIPeer, http: httpx.AsyncClient
) -> None:
    """A client giving up while waiting for headers is recorded too."""
    peer.enqueue(WaitFor(asyncio.Event()))
    posting = asyncio.create_task(
        http.post(f"{peer.base_url}/chat/completions", json=chat_body())
    )
    record = await asyncio.wait_for(peer.wait_for_request(1), SAFETY_TIMEOUT)
    posting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await posting
    await asyncio.wait_for(record.disconnected.wait(), SAFETY_TIMEOUT)


async def test_wait_for_releases_the_stream(
    peer: OpenAIPeer, http: httpx.AsyncClient
) -> None:
    """WaitFor holds the stream until the event is set, then the script goes on."""
    release = asyncio.Event()
    peer.enqueue(Text("a"), WaitFor(release), Text("b"))
    async with http.stream(
        "POST", f"{peer.base_url}/chat/completions", json=chat_body()
    ) as response:
        contents = []
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
            if delta.get("content"):
                contents.append(delta["content"])
                if delta["content"] == "a":
                    assert not peer.requests[0].completed
                    release.set()
    assert contents == ["a", "b"]
    assert peer.requests[0].completed


async def test_stop_abandons_paused_responses(http: httpx.AsyncClient) -> None:
    """Stopping the peer ends responses that wait forever, without a hang-up mark."""
    peer = OpenAIPeer()
    await peer.start()
    peer.enqueue(Hang())
    posting = asyncio.create_task(
        http.post(f"{peer.base_url}/chat/completions", json=chat_body())
    )
    record = await asyncio.wait_for(peer.wait_for_request(1), SAFETY_TIMEOUT)
    await asyncio.wait_for(peer.stop(), SAFETY_TIMEOUT)
    with pytest.raises(httpx.HTTPError):
        await posting
    assert not record.disconnected.is_set()
    assert not record.completed
