"""Paced player on a virtual clock, and the played-audio to heard-text mapping."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.duplex.audio import BYTES_PER_MS
from custom_components.rtvoice.duplex.clock import VirtualClock
from custom_components.rtvoice.duplex.heard import HeardLedger
from custom_components.rtvoice.duplex.player import PacedPlayer, PlayerState
from custom_components.rtvoice.duplex.sentences import SentenceSplitter
from tests.duplex.fakes import FakeTransport

FRAME = 10 * BYTES_PER_MS


def ramp(ms: int) -> bytes:
    """Distinct bytes so any skip or repeat shows."""
    return bytes((i * 7 + i // 251) % 256 for i in range(ms * BYTES_PER_MS))


async def test_paced_with_a_small_lead() -> None:
    """The device never has more than the lead queued; the whole clip arrives in order."""
    clock = VirtualClock()
    transport = FakeTransport()
    leads: list[int] = []

    async def send(frame: bytes) -> None:
        await transport.send(frame)
        leads.append(player.device_queued_bytes())

    player = PacedPlayer(send, clock=clock, lead_ms=100)
    audio = ramp(1000)
    player.enqueue(audio)
    player.finish()
    await player.played()
    assert transport.audio == audio
    assert max(leads) <= 110 * BYTES_PER_MS  # the lead plus the frame being sent
    assert clock.now() == pytest.approx(1.0)
    assert player.played_bytes() == len(audio)
    await player.aclose()


async def test_pause_within_one_frame_and_byte_exact_resume() -> None:
    """No frame after pause(); resume continues with the next unsent byte."""
    clock = VirtualClock()
    transport = FakeTransport()
    player = PacedPlayer(transport.send, clock=clock)
    audio = ramp(600)
    transport.hold_at(20)
    player.enqueue(audio)
    player.finish()
    await transport.holding.wait()  # the 20th frame is being sent
    player.pause()
    paused_at = player.paused_at_played
    assert (
        paused_at == player.played_bytes() == 20 * FRAME - player.device_queued_bytes()
    )
    transport.release()
    await player._changed.wait()  # noqa: SLF001 - the loop sees the pause
    assert len(transport.frames) == 20
    assert player.state is PlayerState.PAUSED
    assert player.queued_bytes == len(audio) - 20 * FRAME
    player.resume()
    await player.played()
    assert transport.audio == audio
    await player.aclose()


async def test_frame_follows_while_the_device_queue_holds_audio() -> None:
    """``frame_follows``: a frame plays right after the previous one unless the device ran dry."""
    clock = VirtualClock()
    follows: list[bool] = []
    player: PacedPlayer

    async def send(frame: bytes) -> None:
        follows.append(player.frame_follows)

    player = PacedPlayer(send, clock=clock, lead_ms=100)
    player.enqueue(ramp(200))
    player.finish()
    await player.played()
    assert follows == [False] + [True] * 19
    clock.advance(0.5)  # the device played everything and idled
    follows.clear()
    player.enqueue(ramp(30))
    player.finish()
    await player.played()
    assert follows == [False, True, True]
    await player.aclose()


async def test_stop_drops_the_rest_and_new_audio_follows() -> None:
    """stop() drops unsent audio; the next enqueue starts where sending stopped."""
    transport = FakeTransport()
    player = PacedPlayer(transport.send, clock=VirtualClock())
    transport.hold_at(5)
    player.enqueue(ramp(500))
    await transport.holding.wait()
    dropped = player.stop()
    transport.release()
    assert dropped == 500 * BYTES_PER_MS - 5 * FRAME
    start = player.enqueue(b"\x01" * FRAME)
    assert start == 5 * FRAME
    await player.played()
    assert transport.frames[-1] == b"\x01" * FRAME
    assert len(transport.frames) == 6
    await player.aclose()
    assert player._task is None  # noqa: SLF001


async def test_partial_frame_waits_for_more_audio_then_pads_at_finish() -> None:
    """A partial frame is sent only when more audio completes it or at finish()."""
    transport = FakeTransport()
    player = PacedPlayer(transport.send, clock=VirtualClock())
    player.enqueue(b"\x02" * (FRAME + 10))
    await transport.sent(1)
    player.enqueue(b"\x03" * (FRAME - 10))
    await transport.sent(2)
    player.enqueue(b"\x04" * 6)
    player.finish()
    await player.played()
    assert transport.frames[1] == b"\x02" * 10 + b"\x03" * (FRAME - 10)
    assert transport.frames[2] == b"\x04" * 6 + bytes(FRAME - 6)
    await player.aclose()


def test_heard_chars_sentences_and_proportional_cut() -> None:
    """Whole sentences played count fully; inside one, the cut moves to its word's end."""
    text = "The kitchen light is on. The hall light is off now."
    splitter = SentenceSplitter(early_min_chars=0)
    first, second = splitter.feed(text) + splitter.flush()
    ledger = HeardLedger(seq=3)
    ledger.add(first, 1000)
    ledger.extend(2000)
    ledger.add(second, 2000)
    ledger.extend(4000)
    assert ledger.heard_chars(500) == 0
    assert ledger.heard_chars(1000) == 0
    assert ledger.heard_chars(1001) == len("The")
    assert text[: ledger.heard_chars(1500)] == "The kitchen"
    assert text[: ledger.heard_chars(2000)] == "The kitchen light is on."
    assert text[: ledger.heard_chars(3000)] == "The kitchen light is on. The hall light"
    assert ledger.heard_chars(4000) == len(text)
    assert ledger.heard_chars(10_000) == len(text)


def test_a_skipped_sentence_counts_once_reached() -> None:
    """A sentence whose TTS failed is counted as reached after its predecessor."""
    splitter = SentenceSplitter(early_min_chars=0)
    first, second, third = (
        splitter.feed("One here. Two here. Three here.") + splitter.flush()
    )
    ledger = HeardLedger(seq=1)
    ledger.add(first, 0)
    ledger.extend(100)
    ledger.skip(second)
    ledger.add(third, 100)
    ledger.extend(200)
    assert ledger.heard_chars(30) == len("One")
    assert ledger.heard_chars(99) == first.end
    assert ledger.heard_chars(100) == second.end
    assert ledger.heard_chars(200) == third.end
