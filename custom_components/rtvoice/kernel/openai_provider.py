"""Chat provider for OpenAI-compatible endpoints (OpenAI, Ollama, llama.cpp, vLLM …).

Uses the ``openai`` SDK's async client with Chat Completions in streaming mode. Text
deltas are passed on as they arrive; streamed tool-call fragments are assembled into
whole calls and handed over in one ``Delta`` when the answer is finished. Closing the
iterator closes the HTTP response at once, so the server stops generating.

The request body is built here as JSON-ready dicts and sent through the client's
public low-level ``post`` (the SDK still does HTTP, errors, SSE parsing and the
stream classes). The SDK's typed ``chat.completions.create`` would walk every message
through its TypedDict annotations on every request, a cost that grows with the
history (about 0.25 ms per message with openai 1.68.2), all on the event loop. Each
message's wire dict is cached on the message and checked against its fields, so a
request costs a list of cached dicts plus the new tail. The body is the same as the
typed path's (``tests/kernel/test_openai_provider.py`` compares them).

Every failure surfaces as a ``ProviderError`` subclass with a short message that never
contains the API key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
import copy
from dataclasses import dataclass, field
import json
import logging
from typing import Any
import uuid

import httpx
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .bounds import MAX_ARGUMENT_CHARS
from .errors import KernelError
from .types import Delta, Message, ToolCall, ToolSpec

_LOGGER = logging.getLogger(__name__)

__all__ = [
    "PLACEHOLDER_API_KEY",
    "OpenAIChatProvider",
    "ProviderAuthError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderModelNotFoundError",
    "ToolCallAssembler",
    "build_request_body",
    "message_to_openai",
    "tool_to_openai",
]

# Local servers (Ollama, llama.cpp …) need no key, but the SDK insists on one.
PLACEHOLDER_API_KEY = "no-key"
_MAX_SERVER_MESSAGE = 200
# Raw JSON of one call's arguments kept while it streams in; longer is an error
# (bounds.py holds the limits on the parsed arguments).
MAX_RAW_ARGUMENT_CHARS = 4 * MAX_ARGUMENT_CHARS


class ProviderError(KernelError):
    """The chat provider failed (HTTP error, broken stream, bad answer)."""


class ProviderAuthError(ProviderError):
    """The endpoint rejected the API key (HTTP 401/403)."""


class ProviderModelNotFoundError(ProviderError):
    """The endpoint does not know the configured model (HTTP 404)."""


class ProviderConnectionError(ProviderError):
    """The endpoint is unreachable, timed out, failed (5xx) or broke the stream."""


class OpenAIChatProvider:
    """A ``ChatProvider`` on an OpenAI-compatible Chat Completions endpoint."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        http_client: httpx.AsyncClient | None = None,
        temperature: float | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create the provider.

        ``http_client``: a shared httpx client (Home Assistant's); when None the SDK
        creates its own, released by ``close``. ``timeout`` applies to connecting and
        to every read, so a server that stops sending mid-stream fails after it.
        Retries are off: failures surface at once.
        """
        self._api_key = api_key or None
        self._model = model
        self._temperature = temperature
        self._owns_http_client = http_client is None
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=self._api_key or PLACEHOLDER_API_KEY,
            http_client=http_client,
            timeout=timeout,
            max_retries=0,
        )

    @property
    def model(self) -> str:
        """The model id requests are sent for."""
        return self._model

    async def close(self) -> None:
        """Release the HTTP client if the provider created it."""
        if self._owns_http_client:
            await self._client.close()

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncGenerator[Delta]:
        """Stream the model's answer to ``messages`` with ``tools`` offered.

        Yields one ``Delta`` per non-empty text delta, then (if the model called
        tools) one ``Delta`` with all complete tool calls. ``aclose`` or cancellation
        closes the HTTP response immediately.
        """
        body = build_request_body(
            self._model, messages, tools, temperature=self._temperature
        )
        try:
            response_stream = await self._client.post(
                "/chat/completions",
                body=body,
                cast_to=ChatCompletion,
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )
        except (openai.OpenAIError, httpx.HTTPError) as err:
            raise self._translate(err) from err
        except asyncio.CancelledError:
            _LOGGER.debug("Model request cancelled before its response headers")
            raise

        assembler = ToolCallAssembler()
        try:
            while True:
                try:
                    chunk = await response_stream.__anext__()
                except StopAsyncIteration:
                    break
                except (openai.OpenAIError, httpx.HTTPError) as err:
                    raise self._translate(err) from err
                for choice in chunk.choices:
                    if choice.index != 0:
                        continue
                    delta = choice.delta
                    if delta.tool_calls:
                        for fragment in delta.tool_calls:
                            function = fragment.function
                            assembler.add(
                                index=getattr(fragment, "index", None),
                                call_id=fragment.id,
                                name=function.name if function else None,
                                arguments=function.arguments if function else None,
                            )
                    if delta.content:
                        yield Delta(content=delta.content)
        except asyncio.CancelledError:
            _LOGGER.debug("Model response cancelled: hanging up")
            raise
        finally:
            # Runs on normal end, errors, aclose() and cancellation alike.
            await _release(response_stream)

        calls = assembler.finish()
        if calls:
            yield Delta(tool_calls=calls)

    async def validate(self) -> None:
        """Check that the endpoint is reachable, accepts the key and has the model.

        Asks ``GET /models/{model}``. On a 404 (unknown model, or no such route)
        the model may still be listed by ``GET /models``; if not, a 1-token chat
        completion decides (servers such as llama.cpp answer for any model name).
        Raises ``ProviderAuthError``, ``ProviderModelNotFoundError`` or
        ``ProviderConnectionError`` (``ProviderError`` for other refusals).
        """
        try:
            await self._client.models.retrieve(self._model)
        except openai.NotFoundError:
            pass  # the model, or the whole route, is missing: look closer below
        except (openai.OpenAIError, httpx.HTTPError) as err:
            raise self._translate(err) from err
        else:
            return

        try:
            listed = [model.id async for model in self._client.models.list()]
        except openai.NotFoundError:
            listed = []
        except (openai.OpenAIError, httpx.HTTPError) as err:
            raise self._translate(err) from err
        if self._model in listed:
            return

        # Some servers (llama.cpp …) serve any model name without listing it; a
        # tiny completion is the only reliable check left.
        try:
            await self._client.chat.completions.create(
                model=self._model,
                messages=[{"role": "user", "content": "ping"}],
                max_tokens=1,
            )
        except (openai.OpenAIError, httpx.HTTPError) as err:
            raise self._translate(err) from err

    def _translate(self, err: Exception) -> ProviderError:
        """Turn an SDK/transport exception into a short ``ProviderError``."""
        if isinstance(err, (openai.APITimeoutError, httpx.TimeoutException)):
            return ProviderConnectionError(
                f"request to the model server timed out ({type(err).__name__})"
            )
        if isinstance(err, openai.APIConnectionError):
            cause = err.__cause__
            detail = type(cause).__name__ if cause is not None else "connection error"
            return ProviderConnectionError(
                f"cannot connect to the model server ({detail})"
            )
        if isinstance(err, httpx.HTTPError):
            return ProviderConnectionError(
                f"connection to the model server broke ({type(err).__name__})"
            )
        if isinstance(err, openai.APIStatusError):
            status = err.status_code
            detail = self._server_message(err)
            if status in (401, 403):
                return ProviderAuthError(
                    f"the model server rejected the API key (HTTP {status}): {detail}"
                )
            if status == 404:
                return ProviderModelNotFoundError(
                    f"model {self._model!r} not found (HTTP 404): {detail}"
                )
            if status >= 500:
                return ProviderConnectionError(
                    f"the model server failed (HTTP {status}): {detail}"
                )
            return ProviderError(f"the model server refused (HTTP {status}): {detail}")
        if isinstance(err, openai.APIError):
            return ProviderError(
                f"the model server reported an error: {self._server_message(err)}"
            )
        return ProviderError(f"model request failed ({type(err).__name__})")

    def _server_message(self, err: openai.APIError) -> str:
        """Return the server's error message, shortened, with the API key masked."""
        body = err.body
        from_body = body.get("message") if isinstance(body, dict) else None
        message = from_body if isinstance(from_body, str) and from_body else err.message
        if self._api_key:
            message = message.replace(self._api_key, "***")
        if len(message) > _MAX_SERVER_MESSAGE:
            message = message[: _MAX_SERVER_MESSAGE - 1] + "…"
        return message


async def _release(response_stream: openai.AsyncStream[Any]) -> None:
    """Close a streamed response at once and finish the SDK's parser.

    Closing the HTTP response makes the server see the hang-up immediately when the
    body was not read to the end. The SDK's chain of parser generators is then
    still suspended (and in a reference cycle): left alone, the garbage collector
    would finalise it at some random later moment, spawning a dozen ``aclose``
    tasks wherever the event loop happens to be. Resuming it on the closed response
    ends it right here with a read error instead.

    Last, one loop iteration: asyncio closes a transport's socket in a callback
    scheduled with ``call_soon``, and it must run before the caller (the kernel)
    does any work for its next request, so the hang-up never waits behind it.
    """
    try:
        await response_stream.close()
    except Exception as err:  # noqa: BLE001 - cleanup must not mask the outcome
        _LOGGER.debug("Closing the model response failed: %r", err)
    try:
        while True:
            await response_stream.__anext__()
    except StopAsyncIteration:
        pass
    except Exception as err:  # noqa: BLE001 - expected: the response is closed
        _LOGGER.debug("Model response parser ended with %r", err)
    await asyncio.sleep(0)


def build_request_body(
    model: str,
    messages: list[Message],
    tools: list[ToolSpec],
    *,
    temperature: float | None = None,
) -> dict[str, Any]:
    """Build the JSON body of a streamed Chat Completions request.

    The same body the SDK's typed ``chat.completions.create(model=..., messages=...,
    stream=True, tools=..., temperature=...)`` sends, with the keys in its order
    (openai 1.x), at the cost of one cached dict per message.
    """
    body: dict[str, Any] = {
        "messages": [_wire_message(message) for message in messages],
        "model": model,
        "stream": True,
    }
    if temperature is not None:
        body["temperature"] = temperature
    if tools:
        body["tools"] = [tool_to_openai(tool) for tool in tools]
    return body


# Attribute under which a message keeps its wire dict (next to context.py's token
# cache): the cache lives and dies with the message, so nothing needs evicting.
_WIRE_CACHE = "_openai_wire_cache"


def _wire_key(message: Message) -> tuple[Any, ...]:
    """Return what a message's wire dict depends on (arguments compared deeply)."""
    calls = message.tool_calls
    return (
        message.role,
        message.content,
        message.tool_call_id,
        tuple((call.id, call.name, call.arguments) for call in calls)
        if calls
        else None,
    )


def _wire_message(message: Message) -> dict[str, Any]:
    """Return ``message_to_openai(message)``, cached on the message.

    History messages are never edited once committed, but ``Message`` is a mutable
    dataclass: the cache is only served while role, content, tool-call id and every
    tool call (id, name and a deep copy of its arguments) still compare equal, so an
    edited message is converted again instead of being sent stale. Unchanged fields
    are the same objects, so the check is mostly identity tests.
    """
    key = _wire_key(message)
    cached = message.__dict__.get(_WIRE_CACHE)
    if cached is not None and cached[0] == key:
        return cached[1]  # type: ignore[no-any-return]
    wire = message_to_openai(message)
    # The snapshot must not share the argument dicts it is compared with.
    message.__dict__[_WIRE_CACHE] = (copy.deepcopy(key), wire)
    return wire


def message_to_openai(message: Message) -> dict[str, Any]:
    """Convert a kernel message to an OpenAI chat message dict.

    Assistant tool calls carry JSON-encoded arguments; an interrupted assistant
    message is sent as ordinary assistant content; empty optional fields are left out.
    """
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    converted: dict[str, Any] = {"role": message.role}
    if message.role == "assistant" and message.tool_calls:
        if message.content:
            converted["content"] = message.content
        converted["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                },
            }
            for call in message.tool_calls
        ]
        return converted
    converted["content"] = message.content
    return converted


def tool_to_openai(tool: ToolSpec) -> dict[str, Any]:
    """Convert a tool spec to an OpenAI ``function`` tool."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    # Some servers reject a function without a schema; "no parameters" is explicit.
    function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


@dataclass
class _PartialToolCall:
    """A tool call being assembled from streamed fragments."""

    call_id: str | None = None
    name: str | None = None
    argument_pieces: list[str] = field(default_factory=list)
    argument_chars: int = 0


class ToolCallAssembler:
    """Collects streamed tool-call fragments and builds whole ``ToolCall``s.

    Fragments are keyed by their ``index``; the first one of a call carries id and
    name, the arguments arrive in pieces. Servers that omit the index, or reuse one
    index for several whole calls, are handled by starting a new call whenever a
    fragment brings a different id.
    """

    def __init__(self) -> None:
        """Start with no calls."""
        self._calls: list[_PartialToolCall] = []
        self._by_index: dict[int, _PartialToolCall] = {}

    def add(
        self,
        *,
        index: int | None,
        call_id: str | None,
        name: str | None,
        arguments: str | None,
    ) -> None:
        """Add one fragment."""
        call = self._by_index.get(index) if index is not None else None
        if call is None and index is None and self._calls and not call_id:
            call = self._calls[-1]
        if call is not None and call_id and call.call_id and call_id != call.call_id:
            call = None  # a new call reusing the index
        if call is None:
            call = _PartialToolCall()
            self._calls.append(call)
            if index is not None:
                self._by_index[index] = call
        if call_id and not call.call_id:
            call.call_id = call_id
        if name and not call.name:
            call.name = name
        if arguments and call.argument_chars <= MAX_RAW_ARGUMENT_CHARS:
            # Past the bound the rest is not kept: the call becomes an error.
            call.argument_pieces.append(arguments)
            call.argument_chars += len(arguments)

    def finish(self) -> list[ToolCall]:
        """Return the complete calls in the order they started."""
        return [_complete(call) for call in self._calls]


def _complete(call: _PartialToolCall) -> ToolCall:
    """Build a ``ToolCall``; bad arguments become ``error`` instead of raising."""
    call_id = call.call_id or f"call_{uuid.uuid4().hex[:24]}"
    name = call.name or ""
    raw = "".join(call.argument_pieces)
    if not name:
        return ToolCall(id=call_id, name="", error="tool call without a function name")
    if not raw.strip():
        return ToolCall(id=call_id, name=name, arguments={})
    if len(raw) > MAX_RAW_ARGUMENT_CHARS:
        return ToolCall(
            id=call_id,
            name=name,
            error=f"arguments longer than {MAX_RAW_ARGUMENT_CHARS} characters",
        )
    try:
        arguments = json.loads(raw)
    except json.JSONDecodeError as err:
        return ToolCall(
            id=call_id,
            name=name,
            error=f"invalid JSON arguments: {err.msg} ({_clip(raw)})",
        )
    except (RecursionError, ValueError) as err:  # nested too deep to parse
        return ToolCall(
            id=call_id,
            name=name,
            error=f"arguments could not be read ({type(err).__name__})",
        )
    if not isinstance(arguments, dict):
        return ToolCall(
            id=call_id,
            name=name,
            error=(
                "invalid JSON arguments: expected an object, got "
                f"{type(arguments).__name__} ({_clip(raw)})"
            ),
        )
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _clip(text: str, limit: int = 80) -> str:
    """Shorten ``text`` for an error message."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
