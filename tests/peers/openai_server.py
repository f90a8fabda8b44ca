"""A loopback OpenAI-compatible server for tests.

``OpenAIPeer`` is a real HTTP server on 127.0.0.1 that speaks the OpenAI Chat
Completions protocol (streaming SSE and plain JSON) plus the ``/v1/models`` routes.
Tests script what the "model" answers, step by step, and inspect what the client sent
and when it hung up::

    async with OpenAIPeer() as peer:
        release = asyncio.Event()
        peer.enqueue(Text("Hello"), WaitFor(release), Text(" world"))
        ...  # point a client at peer.base_url with model DEFAULT_MODEL
        request = await peer.wait_for_request(1)
        await request.disconnected.wait()  # the client closed the stream early

Script steps (one script answers one chat request, FIFO):

- ``Text(content)``: one content delta.
- ``ToolCall(id, name, arguments, fragments=1)``: one tool call whose JSON argument
  string is streamed in ``fragments`` pieces; the first piece carries id and name.
  Several calls in one response get indexes 0..n-1.
- ``Delay(seconds)``: pause (a scripted slow model, not a synchronisation tool).
- ``WaitFor(event)``: pause until the test sets ``event``; holds a stream open
  without sleeping.
- ``Fail(status, message)``: before anything was streamed, answer with that HTTP
  status and an OpenAI-shaped error body; after streaming started, send an SSE error
  event (as OpenAI does) and end the stream without ``[DONE]``.
- ``Drop()``: close the connection abruptly (no ``[DONE]``, incomplete body).
- ``Hang()``: never send anything more (for client timeout tests).

Response headers and the first (role) chunk are sent lazily, right before the first
content, tool call or the end of the stream, so a script that starts with ``Delay``,
``WaitFor`` or ``Hang`` keeps the client waiting for headers, and ``Fail`` after such
pauses still becomes an HTTP error status.

The response ends with ``finish_reason`` ``"tool_calls"`` if it contained tool calls,
else ``"stop"``, followed by ``data: [DONE]``.

Every chat request is recorded in ``peer.requests`` as a ``RecordedRequest`` (also
rejected ones); a rejected request (bad key, unknown model) does not consume a script.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
import json
import os
import socket
import time
from types import TracebackType
from typing import Any, Self
import uuid

from aiohttp import web

__all__ = [
    "DEFAULT_MODEL",
    "Delay",
    "Drop",
    "Fail",
    "Hang",
    "OpenAIPeer",
    "RecordedRequest",
    "Step",
    "Text",
    "ToolCall",
    "WaitFor",
]

DEFAULT_MODEL = "test-model"


@dataclass(frozen=True)
class Text:
    """Stream one content delta."""

    content: str


@dataclass(frozen=True)
class ToolCall:
    """Stream one tool call; ``arguments`` is the raw JSON string the model "writes"."""

    id: str
    name: str
    arguments: str
    fragments: int = 1


@dataclass(frozen=True)
class Delay:
    """Pause the response for ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class WaitFor:
    """Pause the response until ``event`` is set."""

    event: asyncio.Event


@dataclass(frozen=True)
class Fail:
    """Answer with an OpenAI-shaped error (HTTP status, or an SSE error mid-stream)."""

    status: int
    message: str = "scripted failure"


@dataclass(frozen=True)
class Drop:
    """Close the connection abruptly."""


@dataclass(frozen=True)
class Hang:
    """Send nothing more, ever (until the client hangs up or the peer stops)."""


type Step = Text | ToolCall | Delay | WaitFor | Fail | Drop | Hang


@dataclass
class RecordedRequest:
    """One chat completion request as the peer saw it."""

    body: dict[str, Any]
    headers: dict[str, str]
    received_at: float
    """``time.perf_counter()`` when the request body had been read."""
    status: int = 200
    """HTTP status the peer answered with."""
    completed: bool = False
    """True once the peer sent its whole response (an error response counts)."""
    disconnected_at: float | None = None
    """``time.perf_counter()`` when the client hung up before the response was complete."""
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client hung up before the response was complete."""
    dropped_by_peer: bool = False
    """True when a ``Drop`` step closed the connection (not a client hang-up)."""
    transport: asyncio.BaseTransport | None = field(
        default=None, repr=False, compare=False
    )
    """The server side of the request's connection (for ``hang_up_arrived``)."""

    def hang_up_arrived(self) -> bool:
        """Whether the client's hang-up has already reached the server's socket.

        Checked at once, without running the event loop: True when the handler has
        seen it, or when an end-of-stream or a reset waits in the server-side socket
        (peeked, nothing is consumed). So a test can tell that a client closed its
        connection before it went on, not merely that it would close it soon.
        """
        if self.disconnected.is_set():
            return True
        transport = self.transport
        raw = transport.get_extra_info("socket") if transport is not None else None
        if raw is None or raw.fileno() < 0:
            return False
        with socket.socket(fileno=os.dup(raw.fileno())) as probe:
            try:
                pending = probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            except ConnectionResetError:
                return True
        return pending == b""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The ``messages`` the client sent."""
        return list(self.body.get("messages") or [])

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The ``tools`` the client sent, or None when the parameter was absent."""
        tools = self.body.get("tools")
        return None if tools is None else list(tools)

    @property
    def model(self) -> str | None:
        """The requested model id."""
        return self.body.get("model")

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed answer."""
        return bool(self.body.get("stream"))


class _ConnectionGone(Exception):
    """The client hung up, or the peer is stopping: abandon the response."""


def _error_body(status: int, message: str) -> dict[str, Any]:
    """Build an error body shaped like OpenAI's."""
    error_type, code = {
        400: ("invalid_request_error", None),
        401: ("invalid_request_error", "invalid_api_key"),
        403: ("invalid_request_error", "permission_denied"),
        404: ("invalid_request_error", "model_not_found"),
        429: ("requests", "rate_limit_exceeded"),
    }.get(status, ("server_error", None))
    return {
        "error": {"message": message, "type": error_type, "param": None, "code": code}
    }


def _split(text: str, parts: int) -> list[str]:
    """Split ``text`` into ``parts`` consecutive pieces (some may be empty)."""
    parts = max(1, parts)
    size, rest = divmod(len(text), parts)
    pieces: list[str] = []
    start = 0
    for number in range(parts):
        end = start + size + (1 if number < rest else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


class _Responder:
    """Plays one script for one chat request."""

    def __init__(
        self,
        peer: OpenAIPeer,
        request: web.Request,
        record: RecordedRequest,
    ) -> None:
        self._peer = peer
        self._request = request
        self._record = record
        self._response: web.StreamResponse | None = None
        self._completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self._created = int(time.time())
        self._model = str(record.body.get("model") or DEFAULT_MODEL)
        self._tool_calls: list[ToolCall] = []
        self._text: list[str] = []

    async def play(self, script: Iterable[Step]) -> web.StreamResponse:
        """Run the script and return the response for aiohttp to finish."""
        stream = self._record.stream
        for step in script:
            match step:
                case Text(content=content):
                    self._text.append(content)
                    if stream:
                        await self._send_chunk({"content": content})
                case ToolCall():
                    await self._send_tool_call(step, stream)
                case Delay(seconds=seconds):
                    await self._pause(asyncio.sleep(seconds))
                case WaitFor(event=event):
                    await self._pause(event.wait())
                case Hang():
                    await self._pause(None)
                case Fail(status=status, message=message):
                    return await self._fail(status, message)
                case Drop():
                    return self._drop()
        return await self._finish(stream)

    async def _pause(self, waiting: Awaitable[Any] | None) -> None:
        """Wait for ``waiting`` (None: forever) unless the peer stops meanwhile.

        A client hang-up during the pause cancels the handler (aiohttp's handler
        cancellation), which ``OpenAIPeer`` records at once.
        """
        watched: set[asyncio.Future[Any]] = {self._peer.stopping}
        task: asyncio.Future[Any] | None = None
        if waiting is not None:
            task = asyncio.ensure_future(waiting)
            watched.add(task)
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if task is not None and not task.done():
                task.cancel()
        if task is None or not task.done():
            raise _ConnectionGone

    async def _start(self) -> web.StreamResponse:
        """Send headers and the role chunk (once)."""
        if self._response is None:
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream; charset=utf-8",
                    "Cache-Control": "no-cache",
                }
            )
            self._response = response
            await self._write_guarded(response.prepare(self._request))
            await self._send_chunk({"role": "assistant", "content": ""})
        return self._response

    async def _write_guarded(self, writing: Awaitable[Any]) -> None:
        """Write, turning a failed write (client gone) into ``_ConnectionGone``."""
        try:
            await writing
        except ConnectionError as err:
            raise _ConnectionGone from err
        # Some aiohttp versions drop writes into a closing transport silently.
        transport = self._request.transport
        if transport is None or transport.is_closing():
            raise _ConnectionGone

    async def _send_event(self, payload: str) -> None:
        """Send one SSE ``data:`` event."""
        response = await self._start()
        await self._write_guarded(response.write(f"data: {payload}\n\n".encode()))

    async def _send_chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None
    ) -> None:
        """Send one ``chat.completion.chunk``."""
        chunk = {
            "id": self._completion_id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "system_fingerprint": "fp_openai_peer",
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
        }
        await self._send_event(json.dumps(chunk))

    async def _send_tool_call(self, call: ToolCall, stream: bool) -> None:
        """Stream one tool call as fragments of its argument string."""
        index = len(self._tool_calls)
        self._tool_calls.append(call)
        if not stream:
            return
        for number, piece in enumerate(_split(call.arguments, call.fragments)):
            fragment: dict[str, Any] = {"index": index}
            if number == 0:
                fragment.update(
                    id=call.id,
                    type="function",
                    function={"name": call.name, "arguments": piece},
                )
            else:
                fragment["function"] = {"arguments": piece}
            await self._send_chunk({"tool_calls": [fragment]})

    @property
    def _finish_reason(self) -> str:
        return "tool_calls" if self._tool_calls else "stop"

    async def _finish(self, stream: bool) -> web.StreamResponse:
        """End the response normally."""
        if not stream:
            return await self._send_json(200, self._completion())
        await self._send_chunk({}, self._finish_reason)
        await self._send_event("[DONE]")
        self._record.completed = True
        assert self._response is not None
        await self._write_guarded(self._response.write_eof())
        return self._response

    def _completion(self) -> dict[str, Any]:
        """Build the non-streamed ``chat.completion`` object for the script."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text)
            if self._text or not self._tool_calls
            else None,
        }
        if self._tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self._tool_calls
            ]
        return {
            "id": self._completion_id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "system_fingerprint": "fp_openai_peer",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    async def _send_json(self, status: int, body: dict[str, Any]) -> web.StreamResponse:
        """Answer with a complete JSON response."""
        response = web.json_response(body, status=status)
        self._record.status = status
        await self._write_guarded(response.prepare(self._request))
        await self._write_guarded(response.write_eof())
        self._record.completed = True
        return response

    async def _fail(self, status: int, message: str) -> web.StreamResponse:
        """Answer with an error: HTTP status if possible, else an SSE error event."""
        if self._response is None:
            return await self._send_json(status, _error_body(status, message))
        await self._send_event(json.dumps(_error_body(status, message)))
        await self._write_guarded(self._response.write_eof())
        return self._response

    def _drop(self) -> web.StreamResponse:
        """Close the connection without finishing the response."""
        self._record.dropped_by_peer = True
        transport = self._request.transport
        if transport is not None:
            transport.close()
        return self._response or web.StreamResponse()


class OpenAIPeer:
    """A scripted OpenAI-compatible server on 127.0.0.1 (random free port)."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        models: Iterable[str] = (DEFAULT_MODEL,),
        serve_models: bool = True,
    ) -> None:
        """Create the peer (``start`` it, or use ``async with``).

        ``api_key``: when set, every request must send ``Authorization: Bearer <key>``.
        ``models``: known model ids; others get 404 (mutable via ``peer.models``).
        ``serve_models``: False leaves out the ``/v1/models`` routes entirely, like
        servers that only implement chat completions.
        """
        self.api_key = api_key
        self.models: set[str] = set(models)
        self.requests: list[RecordedRequest] = []
        self._serve_models = serve_models
        self._scripts: deque[tuple[Step, ...]] = deque()
        self._default_script: tuple[Step, ...] = (Text("ok"),)
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._request_arrived: asyncio.Condition | None = None
        self._stopping: asyncio.Future[None] | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Start listening on a random free port of 127.0.0.1."""
        if self._runner is not None:
            return
        loop = asyncio.get_running_loop()
        self._stopping = loop.create_future()
        self._request_arrived = asyncio.Condition()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        if self._serve_models:
            app.router.add_get("/v1/models", self._handle_models)
            app.router.add_get("/v1/models/{model:.+}", self._handle_model)
        # handler_cancellation: aiohttp cancels a handler the moment its client's
        # connection is lost, so hang-ups are seen even while a script is paused.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=5.0
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        server = site._server  # noqa: SLF001 - aiohttp exposes no bound-port accessor
        assert isinstance(server, asyncio.Server)
        self._port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop the server; responses still waiting on a script step are abandoned."""
        if self._runner is None:
            return
        assert self._stopping is not None
        if not self._stopping.done():
            self._stopping.set_result(None)
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        """Start the peer."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop the peer."""
        await self.stop()

    # -- addressing --------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port the peer listens on."""
        if self._port is None:
            raise RuntimeError("OpenAIPeer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """Base URL for OpenAI clients, ending in ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def stopping(self) -> asyncio.Future[None]:
        """Resolves when ``stop`` begins (script pauses give up then)."""
        if self._stopping is None:
            raise RuntimeError("OpenAIPeer is not started")
        return self._stopping

    # -- scripting ---------------------------------------------------------------

    def enqueue(self, *steps: Step) -> None:
        """Add the script for the next chat request that has none yet (FIFO)."""
        self._scripts.append(tuple(steps))

    def default_reply(self, *steps: Step) -> None:
        """Set the script used when nothing is enqueued (initially ``Text("ok")``)."""
        self._default_script = tuple(steps)

    @property
    def pending_scripts(self) -> int:
        """How many enqueued scripts no request has used yet."""
        return len(self._scripts)

    async def wait_for_request(self, number: int) -> RecordedRequest:
        """Wait until the ``number``-th (1-based) chat request arrived; return it."""
        if self._request_arrived is None:
            raise RuntimeError("OpenAIPeer is not started")
        async with self._request_arrived:
            await self._request_arrived.wait_for(lambda: len(self.requests) >= number)
        return self.requests[number - 1]

    # -- handlers ----------------------------------------------------------------

    def _auth_error(self, request: web.Request) -> web.Response | None:
        """Return a 401 response if the request lacks the required key."""
        if self.api_key is None:
            return None
        authorization = request.headers.get("Authorization", "")
        if authorization == f"Bearer {self.api_key}":
            return None
        # Echo the key in full, as a careless server might: clients must not pass
        # server messages on unmasked.
        sent_key = authorization.removeprefix("Bearer ")
        return web.json_response(
            _error_body(401, f"Incorrect API key provided: {sent_key}."), status=401
        )

    def _model_object(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": 0, "owned_by": "openai-peer"}

    async def _handle_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``."""
        if (error := self._auth_error(request)) is not None:
            return error
        return web.json_response(
            {
                "object": "list",
                "data": [self._model_object(model) for model in sorted(self.models)],
            }
        )

    async def _handle_model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{model}``."""
        if (error := self._auth_error(request)) is not None:
            return error
        model = request.match_info["model"]
        if model not in self.models:
            return web.json_response(
                _error_body(404, f"The model `{model}` does not exist."), status=404
            )
        return web.json_response(self._model_object(model))

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``: record, check, then play a script."""
        body = await request.json()
        record = RecordedRequest(
            body=body,
            headers=dict(request.headers),
            received_at=time.perf_counter(),
            transport=request.transport,
        )
        self.requests.append(record)
        assert self._request_arrived is not None
        async with self._request_arrived:
            self._request_arrived.notify_all()

        rejection = self._auth_error(request)
        if rejection is None and body.get("model") not in self.models:
            model = body.get("model")
            rejection = web.json_response(
                _error_body(
                    404,
                    f"The model `{model}` does not exist or you do not have access to it.",
                ),
                status=404,
            )
        if rejection is not None:
            record.status = rejection.status
            record.completed = True
            return rejection

        script = self._scripts.popleft() if self._scripts else self._default_script
        try:
            return await _Responder(self, request, record).play(script)
        except asyncio.CancelledError:
            if request.transport is None:  # connection_lost cancelled the handler
                self._note_client_gone(record)
            raise
        except _ConnectionGone:
            if not self.stopping.done():
                self._note_client_gone(record)
            if (transport := request.transport) is not None:
                transport.close()
            # aiohttp "finishes" the returned response; on the closed transport that
            # is a quiet ConnectionError.
            return web.StreamResponse()

    def _note_client_gone(self, record: RecordedRequest) -> None:
        """Record a client hang-up that happened before the response was complete."""
        if record.completed or record.dropped_by_peer or record.disconnected.is_set():
            return
        if self.stopping.done():
            return
        record.disconnected_at = time.perf_counter()
        record.disconnected.set()
