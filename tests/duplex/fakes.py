"""Event-driven fakes for the duplex tests: a transport that can hold a frame."""

from __future__ import annotations

import asyncio


class FakeTransport:
    """Records frames; ``hold_at(n)`` makes the n-th send wait until ``release()``."""

    def __init__(self) -> None:
        """Start with nothing sent and nothing held."""
        self.frames: list[bytes] = []
        self._hold_at: int | None = None
        self.holding = asyncio.Event()
        self._release = asyncio.Event()
        self._count_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def hold_at(self, n: int) -> None:
        """Make the n-th frame's send (1-based) block until released."""
        self._hold_at = n
        self.holding.clear()
        self._release.clear()

    def release(self) -> None:
        """Let the held send return."""
        self._hold_at = None
        self._release.set()

    async def sent(self, n: int) -> None:
        """Wait until ``n`` frames have been sent."""
        if len(self.frames) >= n:
            return
        future = asyncio.get_running_loop().create_future()
        self._count_waiters.append((n, future))
        await future

    async def send(self, frame: bytes) -> None:
        """Record a frame (and maybe hold)."""
        self.frames.append(frame)
        for n, future in list(self._count_waiters):
            if len(self.frames) >= n and not future.done():
                future.set_result(None)
        if self._hold_at is not None and len(self.frames) == self._hold_at:
            self.holding.set()
            await self._release.wait()

    @property
    def audio(self) -> bytes:
        """Everything sent, concatenated."""
        return b"".join(self.frames)


class Ticket:
    """What FakeChild.push returns."""

    def __init__(self, seq: int) -> None:
        """Bind a seq to an unresolved outcome."""
        self.seq = seq
        self.outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()


class FakeChild:
    """Records pushes, interrupts and acknowledgements (the kernel is built elsewhere)."""

    def __init__(self) -> None:
        """Start at seq 0 with nothing recorded."""
        self.seq = 0
        self.pushes: list[str] = []
        self.tickets: list[Ticket] = []
        self.acks: list[tuple[int, int, bool]] = []
        self.interrupts = 0
        self.speculative: list[int] = []  # seqs pushed speculatively
        self.confirms: list[int] = []
        self.withdrawn: list[int] = []
        self.confirm_fails = False
        self.pushed = asyncio.Event()
        self.acked_final = asyncio.Event()
        self._final_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def push(self, text: str, *, speculative: bool = False) -> Ticket:
        """Record the words and return a ticket for a new round."""
        self.seq += 1
        self.pushes.append(text)
        if speculative:
            self.speculative.append(self.seq)
        ticket = Ticket(self.seq)
        self.tickets.append(ticket)
        self.pushed.set()
        return ticket

    def confirm(self, seq: int) -> bool:
        """Record a confirmation (``confirm_fails``: as if the round had failed)."""
        self.confirms.append(seq)
        return not self.confirm_fails

    def withdraw(self, seq: int) -> bool:
        """Record a withdrawal; the round settles superseded, as the kernel's does."""
        self.withdrawn.append(seq)
        ticket = self.tickets[seq - 1]
        if not ticket.outcome.done():
            ticket.outcome.set_result("superseded")
        return True

    def interrupt(self) -> bool:
        """Count interrupts."""
        self.interrupts += 1
        return True

    def acknowledge(self, seq: int, chars: int, *, final: bool = False) -> None:
        """Record an acknowledgement."""
        self.acks.append((seq, chars, final))
        if final:
            self.acked_final.set()
            count = len(self.finals())
            for n, future in self._final_waiters:
                if count >= n and not future.done():
                    future.set_result(None)

    async def final_acks(self, n: int) -> None:
        """Wait until ``n`` final acknowledgements have arrived."""
        if len(self.finals()) >= n:
            return
        future = asyncio.get_running_loop().create_future()
        self._final_waiters.append((n, future))
        await future

    def finals(self) -> list[tuple[int, int]]:
        """Return the final acknowledgements as (seq, chars)."""
        return [(seq, chars) for seq, chars, final in self.acks if final]


class FakeStt:
    """Answers utterances from a script; ``gate`` makes it wait for the test."""

    def __init__(self, *answers: str | Exception) -> None:
        """Answer with ``answers`` in order."""
        self.answers = list(answers)
        self.heard: list[bytes] = []
        self.started = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def __call__(self, pcm: bytes) -> str:
        """Transcribe (pop the next scripted answer)."""
        self.heard.append(pcm)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class FakeTts:
    """Synthesises each sentence as ``ms_per_sentence`` of a byte pattern of its own."""

    def __init__(
        self, ms_per_sentence: int = 300, *, fail_on: str | None = None
    ) -> None:
        """Make ``ms_per_sentence`` of audio per sentence; raise for ``fail_on``."""
        self.bytes = ms_per_sentence * 32
        self.fail_on = fail_on
        self.sentences: list[str] = []
        self.closed = 0

    def audio(self, index: int) -> bytes:
        """Return the audio of sentence number ``index`` (never looks like speech)."""
        return bytes([index % 250 + 1, 0]) * (self.bytes // 2)

    async def __call__(self, text: str):
        """Yield the sentence's audio in two chunks."""
        index = len(self.sentences)
        self.sentences.append(text)
        try:
            if text == self.fail_on:
                raise RuntimeError("tts down")
            audio = self.audio(index)
            half = len(audio) // 2 + 1  # odd: a sample split across chunks
            yield audio[:half]
            yield audio[half:]
        finally:
            self.closed += 1
