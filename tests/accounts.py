"""What a failed test's conversation did, printed under its error.

A test that times out on a busy CI machine says only where it waited; the CI
output keeps the error and little else. ``accounted(describe)`` adds
``describe()`` and the component's warnings to any exception raised inside, as an
exception note (pytest prints notes under the error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
import logging
from typing import Any

from tests.peers.wyoming_speech import WyomingSttServer

__all__ = ["accounted", "duplex_account"]


@contextmanager
def accounted(describe: Callable[[], str]) -> Iterator[None]:
    """Add ``describe()`` and the component's warnings to an exception raised inside."""
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("custom_components.rtvoice")
    logger.addHandler(handler)
    try:
        yield
    except BaseException as err:
        try:
            account = describe()
        except Exception as failure:  # noqa: BLE001 - the test's own error matters
            account = f"(no account: {failure!r})"
        err.add_note(f"{account}\nwarnings: {warnings or 'none'}")
        raise
    finally:
        logger.removeHandler(handler)


def duplex_account(
    link: Any, stt: WyomingSttServer, model_requests: int, states: list[str]
) -> str:
    """Say what a duplex satellite's conversation did, for a failed test's report."""
    lines = [
        f"satellite states: {states}",
        f"model requests: {model_requests}",
        f"STT heard: {[request.transcript for request in stt.requests]}",
    ]
    conversation = link.conversation
    if conversation is None:
        lines.append("no live conversation")
    else:
        session = conversation.session
        lines.append(f"session {session.state} at mic {session.mic_ms} ms")
        lines.append(f"stats: {session.stats}")
    return "\n".join(lines)
