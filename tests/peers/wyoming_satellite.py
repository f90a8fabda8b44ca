"""A real `wyoming-satellite` process for tests, its mic and speaker wired to the test.

``satellite_python()`` makes (or reuses) the satellite's own venv with
``scripts/wyoming_satellite_venv`` (PyPI only; wyoming-satellite 1.0.0 pins wyoming
1.4.1, HA pins 1.5.4). ``WyomingSatellite`` runs it in always-streaming mode (no
``--vad``, no wake service) on a free loopback port::

    async with Microphone() as mic, Speaker() as speaker:
        async with WyomingSatellite(python, mic=mic, speaker=speaker) as satellite:
            satellite.host, satellite.port           # give these to the link
            await mic.say(speak("hey jarvis"))       # real-time pace; when each chunk was fed
            playback = await speaker.wait_for_playback(1)  # .pcm, .first_at, .last_at
            await satellite.kill(); await satellite.start()

The satellite's ``--mic-command`` is this file in ``mic`` mode: it connects to the
test's ``Microphone`` and copies what it gets to stdout (raw 16 kHz s16le mono). The
``Microphone`` sends silence, or the clips queued by ``say()``, in 32 ms chunks at
real-time pace (a microphone's pace, not a synchronisation). ``--snd-command`` is this
file in ``snd`` mode: it copies its stdin to the test's ``Speaker``; the satellite
starts one per ``audio-start`` and closes it after ``audio-stop``, so each connection
is one ``Playback``.
"""

from __future__ import annotations

import asyncio
from collections import deque
import contextlib
from dataclasses import dataclass, field
import os
from pathlib import Path
import socket
import subprocess
import sys
from types import TracebackType
from typing import Self

ROOT = Path(__file__).resolve().parents[2]
VENV_SCRIPT = ROOT / "scripts" / "wyoming_satellite_venv"
CHUNK_MS = 32
CHUNK_BYTES = CHUNK_MS * 32


class SatelliteVenvError(RuntimeError):
    """The satellite's venv could not be made; the message says why."""


def satellite_python() -> str:
    """Return the python of the wyoming-satellite venv, making it if needed (blocking)."""
    env = dict(os.environ)
    env.setdefault("PYTHON", sys.executable)
    try:
        result = subprocess.run(
            ["bash", str(VENV_SCRIPT)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SatelliteVenvError(f"{VENV_SCRIPT.name}: {err}") from err
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-3:]
        raise SatelliteVenvError(f"{VENV_SCRIPT.name} failed: {' | '.join(tail)}")
    return result.stdout.strip().splitlines()[-1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Microphone:
    """The satellite's microphone: silence, or queued speech, at real-time pace."""

    def __init__(self) -> None:
        """Not listening yet."""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._queue: deque[tuple[bytes, asyncio.Future[list[float]]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.connected = asyncio.Event()

    async def __aenter__(self) -> Self:
        """Listen on a loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop serving."""
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.wait_closed()

    def say(self, pcm: bytes) -> asyncio.Future[list[float]]:
        """Queue speech; the future gives the loop time each 32 ms chunk of it was fed."""
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._queue.append((pcm, future))
        return future

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self.connected.set()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        current: tuple[memoryview, asyncio.Future[list[float]]] | None = None
        offset = 0
        times: list[float] = []
        try:
            while True:
                if current is None and self._queue:
                    pcm, future = self._queue.popleft()
                    current, offset = (memoryview(pcm), future), 0
                    times = []
                if current is not None:
                    chunk = bytes(current[0][offset : offset + CHUNK_BYTES])
                    offset += len(chunk)
                    chunk += bytes(CHUNK_BYTES - len(chunk))
                else:
                    chunk = bytes(CHUNK_BYTES)
                writer.write(chunk)
                if current is not None:
                    times.append(loop.time())
                await writer.drain()
                if current is not None and offset >= len(current[0]):
                    if not current[1].done():
                        current[1].set_result(times)
                    current = None
                next_at += CHUNK_MS / 1000
                await asyncio.sleep(max(0.0, next_at - loop.time()))
        except (ConnectionError, OSError):
            pass  # the satellite (and its mic command) went away
        finally:
            writer.close()
            self._tasks.discard(task)


@dataclass
class Playback:
    """One audio-start .. audio-stop as the satellite's speaker command got it."""

    started_at: float
    pcm: bytearray = field(default_factory=bytearray)
    first_at: float | None = None
    last_at: float | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Speaker:
    """The satellite's speaker: records what each --snd-command run was given."""

    def __init__(self) -> None:
        """Not listening yet."""
        self.port = 0
        self.playbacks: list[Playback] = []
        self._server: asyncio.Server | None = None
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> Self:
        """Listen on a loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop serving."""
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def wait_for_playback(self, number: int, *, ended: bool = True) -> Playback:
        """Return playback ``number`` (1-based) once it has audio (and has ended)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    len(self.playbacks) >= number
                    and self.playbacks[number - 1].first_at is not None
                )
            )
        playback = self.playbacks[number - 1]
        if ended:
            await playback.ended.wait()
        return playback

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        playback = Playback(started_at=loop.time())
        self.playbacks.append(playback)
        try:
            while data := await reader.read(65536):
                playback.pcm += data
                now = loop.time()
                if playback.first_at is None:
                    playback.first_at = now
                    async with self._changed:
                        self._changed.notify_all()
                playback.last_at = now
        except (ConnectionError, OSError):
            pass
        finally:
            playback.ended.set()
            writer.close()
            async with self._changed:
                self._changed.notify_all()


class WyomingSatellite:
    """A `wyoming-satellite` process in always-streaming mode."""

    def __init__(
        self,
        python: str,
        *,
        mic: Microphone,
        speaker: Speaker,
        name: str = "test satellite",
    ) -> None:
        """Prepare the command line; ``start()`` runs it."""
        self.python = python
        self.mic = mic
        self.speaker = speaker
        self.name = name
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    def _command(self) -> list[str]:
        io = f"{sys.executable} {Path(__file__).resolve()}"
        return [
            self.python,
            "-m",
            "wyoming_satellite",
            "--uri",
            f"tcp://{self.host}:{self.port}",
            "--name",
            self.name,
            "--no-zeroconf",
            "--mic-command",
            f"{io} mic {self.mic.port}",
            "--mic-command-rate",
            "16000",
            "--snd-command",
            f"{io} snd {self.speaker.port}",
            "--snd-command-rate",
            "16000",
        ]

    async def start(self) -> None:
        """Start the process; the link's reconnect loop finds its port when it opens."""
        self.process = await asyncio.create_subprocess_exec(
            *self._command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        self.starts += 1

    async def kill(self) -> None:
        """Kill the process (SIGKILL: a satellite that loses power)."""
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()

    async def __aenter__(self) -> Self:
        """Start the satellite."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the satellite."""
        await self.kill()


def _mic(port: int) -> None:
    """Copy what the test's Microphone sends to stdout."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        out = sys.stdout.buffer
        while data := sock.recv(65536):
            out.write(data)
            out.flush()


def _snd(port: int) -> None:
    """Copy stdin to the test's Speaker."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        source = sys.stdin.buffer
        while data := source.read1(65536):
            sock.sendall(data)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, ConnectionError, KeyboardInterrupt):
        {"mic": _mic, "snd": _snd}[sys.argv[1]](int(sys.argv[2]))
