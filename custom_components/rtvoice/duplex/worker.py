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

The queue is bounded: mic audio that arrives faster than real time (a device
flooding its stream) would otherwise queue jobs without end. A job submitted
``droppable`` (mic analysis) may be dropped, the oldest first, once
``max_queued`` jobs wait; ``dropped`` counts them (diagnostics). Other jobs
(control: a segmenter restart) are never dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
import contextlib
import logging
import threading
from typing import Any, Final

_LOGGER = logging.getLogger(__name__)

_STOP = object()
# Jobs waiting: mic chunks of 32 ms, ~8 s of audio (~256 KB). A busy machine that
# falls a few seconds behind loses nothing; only a flood reaches the bound.
MAX_QUEUED: Final = 256


class DspWorker:
    """Runs blocking DSP jobs in order on one thread; results come back on the loop."""

    def __init__(self, name: str = "rtvoice dsp", max_queued: int = MAX_QUEUED) -> None:
        """Create the worker; its thread starts with the first job."""
        self.name = name
        self.max_queued = max_queued
        self._jobs: deque[Any] = deque()  # (job, args, done, droppable), or _STOP
        self._ready = threading.Condition()
        self.dropped = 0  # droppable jobs dropped, the queue being full (diagnostics)
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
        droppable: bool = False,
    ) -> bool:
        """Queue ``job(*args)``; ``done(result)`` runs on the loop after it.

        Return False (and run nothing) once the worker is closed. Call from the loop.
        With ``max_queued`` jobs waiting, the oldest droppable one is dropped (its
        ``done`` never runs).
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
        with self._ready:
            if len(self._jobs) >= self.max_queued:
                self._drop_oldest()
            self._jobs.append((job, args, done, droppable))
            self._ready.notify()
        return True

    def _drop_oldest(self) -> None:
        """Drop the oldest droppable job waiting (with ``_ready`` held)."""
        for index, item in enumerate(self._jobs):
            if item is not _STOP and item[3]:
                del self._jobs[index]
                self.dropped += 1
                return

    @property
    def queued(self) -> int:
        """Jobs waiting now."""
        return len(self._jobs)

    async def aclose(self) -> None:
        """Skip queued jobs, let the running one finish, wait for the thread to exit.

        Every caller awaits the same exit; a cancelled caller stops waiting, the
        thread still ends on its own (at most one job later).
        """
        if not self._closed:
            self._closed = True
            if self._thread is not None:
                with self._ready:
                    self._jobs.append(_STOP)
                    self._ready.notify()
        exited, thread = self._exited, self._thread
        if exited is None or thread is None:
            return
        await asyncio.shield(exited)
        thread.join()  # it has signalled its last act: returns at once

    def _run(
        self, loop: asyncio.AbstractEventLoop, exited: asyncio.Future[None]
    ) -> None:
        try:
            while (item := self._next()) is not _STOP:
                if self._closed:
                    continue  # closing: queued work is skipped
                job, args, done, _droppable = item
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

    def _next(self) -> Any:
        with self._ready:
            while not self._jobs:
                self._ready.wait()
            return self._jobs.popleft()


def _log_failure(name: str, err: Exception) -> None:
    _LOGGER.error("Audio processing failed in %s: %s", name, type(err).__name__)


def _set_exited(exited: asyncio.Future[None]) -> None:
    if not exited.done():
        exited.set_result(None)
