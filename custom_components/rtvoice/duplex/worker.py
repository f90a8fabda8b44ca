"""One ordered worker thread per audio stream: the mic DSP off the event loop.

Per 32 ms mic chunk the session runs the echo canceller, the onset gate and the VAD
(~0.4–1.2 ms of CPU); with many satellites that is a visible share of Home
Assistant's event loop. ``DspWorker`` runs those jobs on a thread of its own, in the
order they were submitted (one thread, one FIFO: no reordering), and hands each
result back to the loop with ``call_soon_threadsafe`` as soon as it is computed (no
batching: the only latency added is the DSP itself plus one loop wake-up).

The thread starts on the first job and ends in ``aclose``: jobs still queued are
skipped, the running one finishes, and ``aclose`` returns once the thread has exited.
A job that raises is logged (its type only) and the worker goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import contextlib
import logging
import queue
import threading
from typing import Any

_LOGGER = logging.getLogger(__name__)

_STOP = object()


class DspWorker:
    """Runs blocking DSP jobs in order on one thread; results come back on the loop."""

    def __init__(self, name: str = "rtvoice dsp") -> None:
        """Create the worker; its thread starts with the first job."""
        self.name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exited: asyncio.Future[None] | None = None
        self._closed = False
        self.jobs = 0  # jobs run (diagnostics)

    @property
    def closed(self) -> bool:
        """True once ``aclose`` began: new jobs are refused."""
        return self._closed

    def submit(
        self,
        job: Callable[..., Any],
        *args: Any,
        done: Callable[[Any], None] | None = None,
    ) -> bool:
        """Queue ``job(*args)``; ``done(result)`` runs on the loop after it.

        Return False (and run nothing) once the worker is closed. Call from the loop.
        """
        if self._closed:
            return False
        if self._thread is None:
            loop = asyncio.get_running_loop()
            self._loop = loop
            self._exited = loop.create_future()
            self._thread = threading.Thread(
                target=self._run, args=(loop, self._exited), name=self.name, daemon=True
            )
            self._thread.start()
        self._jobs.put((job, args, done))
        return True

    async def aclose(self) -> None:
        """Skip queued jobs, let the running one finish, wait for the thread to exit.

        Every caller awaits the same exit; a cancelled caller stops waiting, the
        thread still ends on its own (at most one job later).
        """
        if not self._closed:
            self._closed = True
            if self._thread is not None:
                self._jobs.put(_STOP)
        exited, thread = self._exited, self._thread
        if exited is None or thread is None:
            return
        await asyncio.shield(exited)
        thread.join()  # it has signalled its last act: returns at once

    def _run(
        self, loop: asyncio.AbstractEventLoop, exited: asyncio.Future[None]
    ) -> None:
        try:
            while (item := self._jobs.get()) is not _STOP:
                if self._closed:
                    continue  # closing: queued work is skipped
                job, args, done = item
                try:
                    result = job(*args)
                except Exception as err:  # noqa: BLE001 - one chunk lost, not the stream
                    loop.call_soon_threadsafe(_log_failure, self.name, err)
                    continue
                self.jobs += 1
                if done is not None:
                    loop.call_soon_threadsafe(done, result)
        except RuntimeError:  # pragma: no cover - the loop closed under us
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under us
            loop.call_soon_threadsafe(_set_exited, exited)


def _log_failure(name: str, err: Exception) -> None:
    _LOGGER.error("Audio processing failed in %s: %s", name, type(err).__name__)


def _set_exited(exited: asyncio.Future[None]) -> None:
    if not exited.done():
        exited.set_result(None)
