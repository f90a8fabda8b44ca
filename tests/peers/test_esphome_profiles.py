"""The emulator's device profiles against the firmware rules they encode.

A real aioesphomeapi client (``FakeHA``) drives each profile; the assertions are the
firmware's behaviour as read from ESPHome 2026.10.0 (``voice_assistant.cpp``,
``i2s_audio/``) and the devices' YAML: see ``tests/peers/esphome/i2s.py`` and
``profiles.py``. Waits are event-driven; no timing threshold is asserted beyond
what the firmware's buffer sizes fix.
"""

from __future__ import annotations

import pytest

from tests.peers.esphome import (
    PROFILE_NAMES,
    EmulatedDevice,
    EventType,
    Feature,
    Kind,
    State,
)
from tests.peers.esphome.i2s import SPEAKER_BUFFER_SIZE
from tests.peers.test_esphome_device import FakeHA, wait

pytestmark = pytest.mark.usefixtures("socket_enabled")

CHUNK = 1024  # 32 ms of 16 kHz mono s16le


def tone(chunks: int) -> bytes:
    """Distinct non-zero samples (so played audio can be matched to what was sent)."""
    return b"".join(
        int(1000 + i % 20000).to_bytes(2, "little", signed=True)
        for i in range(chunks * CHUNK // 2)
    )


async def connected(device: EmulatedDevice) -> FakeHA:
    """Connect a client that owns the voice assistant."""
    ha = await FakeHA(device).connect(login=False)
    ha.subscribe_voice()
    await wait(device.wait_for_voice_client())
    return ha


async def streaming(device: EmulatedDevice, ha: FakeHA) -> None:
    """Say a wake word and answer the start: the mic streams."""
    run = device.wake()
    assert run is not None
    await wait(ha.starts.get())
    await wait(run.streaming.wait())


@pytest.mark.parametrize("name", PROFILE_NAMES)
async def test_handshake_is_2026(name: str) -> None:
    """Hello 1.19; flags as get_feature_flags(): SPEAKER or ANNOUNCE, never both."""
    async with EmulatedDevice(profile=name) as device:
        ha = await connected(device)
        info = await wait(ha.client.device_info())
        assert ha.client.api_version is not None
        assert (ha.client.api_version.major, ha.client.api_version.minor) == (1, 19)
        flags = Feature(info.voice_assistant_feature_flags)
        assert bool(flags & Feature.SPEAKER) != bool(flags & Feature.ANNOUNCE)
        assert flags & Feature.VOICE_ASSISTANT and flags & Feature.API_AUDIO
        if name != "linux-voice-assistant":
            assert info.legacy_voice_assistant_version == 0
        await ha.close()
        assert device.voice.errors == []


async def test_full_duplex_plays_while_the_mic_streams_and_records_what_was_heard() -> (
    None
):
    """s3-duplex: API audio sent while streaming is heard, sample for sample, in order."""
    async with EmulatedDevice(profile="s3-duplex") as device:
        ha = await connected(device)
        await streaming(device, ha)
        speaker = device.loudspeaker
        assert speaker is not None
        sent = tone(8)
        for index in range(8):
            ha.client.send_voice_assistant_audio(
                sent[index * CHUNK : (index + 1) * CHUNK]
            )
            await ha.barrier()
        await wait(
            speaker.stopped.wait()
        )  # the idle stop, 500 ms after the ring ran dry
        heard = speaker.heard_pcm()
        assert device.state == State.STREAMING_MICROPHONE  # the mic never stopped
        assert speaker.dropped_bytes == 0
        # Fed only when a message arrives: what was still in the 16 KiB buffer after
        # the last message never reached the speaker.
        assert heard == sent[: len(heard)]
        assert len(heard) + len(speaker.buffer) == len(sent)
        await ha.close()


async def test_a_burst_beyond_16_kib_is_dropped_and_counted() -> None:
    """on_audio drops a message that does not fit the voice assistant's buffer."""
    async with EmulatedDevice(profile="s3-duplex") as device:
        ha = await connected(device)
        await streaming(device, ha)
        speaker = device.loudspeaker
        assert speaker is not None
        for _ in range(24):  # 24 KiB at once: the speaker has not even started
            ha.client.send_voice_assistant_audio(bytes(CHUNK))
        await ha.barrier()
        assert speaker.dropped_bytes == 24 * CHUNK - SPEAKER_BUFFER_SIZE
        assert any(
            e.detail.get("what") == "Cannot receive audio, buffer is full"
            for e in device.events.select(lambda e: e.kind is Kind.NOTE)
        )
        await ha.close()


async def test_shared_bus_plays_nothing_while_the_mic_holds_it() -> None:
    """atom-echo: the speaker cannot start while the mic streams (Parent bus is busy)."""
    async with EmulatedDevice(profile="atom-echo") as device:
        ha = await connected(device)
        await streaming(device, ha)
        speaker = device.loudspeaker
        assert speaker is not None
        for _ in range(20):
            ha.client.send_voice_assistant_audio(bytes(CHUNK))
            await ha.barrier()
        await wait(
            device.wait_for(
                lambda e: (
                    e.kind is Kind.NOTE and e.detail["what"] == "Parent bus is busy"
                )
            )
        )
        assert speaker.played == []
        assert speaker.dropped_bytes == 20 * CHUNK - SPEAKER_BUFFER_SIZE
        await ha.close()


async def test_shared_bus_plays_once_the_utterance_ended_and_listens_again() -> None:
    """atom-echo: STT_VAD_END frees the bus, the answer plays in full, then it listens.

    ``before_reply`` stops the wake word too; the run ends and
    ``continue_conversation`` starts a new one.
    """
    async with EmulatedDevice(profile="atom-echo") as device:
        ha = await connected(device)
        await streaming(device, ha)
        speaker = device.loudspeaker
        assert speaker is not None
        released = device.mark()
        ha.event(EventType.STT_VAD_END)
        await wait(
            device.wait_for(
                lambda e: (
                    e.kind is Kind.NOTE
                    and e.detail["what"] == "mic released the I2S bus"
                ),
                released,
            )
        )
        assert device.voice.wake_word_running is False
        ha.event(EventType.INTENT_END, continue_conversation="1")
        ha.event(EventType.TTS_STREAM_START)
        sent = tone(12)
        for index in range(12):
            ha.client.send_voice_assistant_audio(
                sent[index * CHUNK : (index + 1) * CHUNK]
            )
            await ha.barrier()
        ha.event(EventType.TTS_STREAM_END)
        ha.event(EventType.TTS_END, url="api-audio")
        ha.event(EventType.RUN_END)
        await wait(ha.starts.get())  # continue_conversation: a new start request
        assert speaker.heard_pcm() == sent  # everything sent was heard
        assert speaker.dropped_bytes == 0 and speaker.bus_busy == 0
        assert device.runs[-1].continued
        await ha.close()
        assert device.voice.errors == []


@pytest.mark.parametrize("name", ["voice-pe-stock", "linux-voice-assistant"])
async def test_media_player_profiles_drop_api_audio(name: str) -> None:
    """No ``speaker:``: raw API audio is never heard, on any version."""
    async with EmulatedDevice(profile=name) as device:
        ha = await connected(device)
        ha.client.send_voice_assistant_audio(bytes(CHUNK))
        await ha.barrier()
        assert device.loudspeaker is None
        assert [p.audible for p in device.playbacks] == [False]
        await ha.close()


async def test_linux_voice_assistant_stops_its_mic_on_stt_end() -> None:
    """LVA's handle_voice_event: STT_END stops the mic stream as STT_VAD_END does."""
    async with EmulatedDevice(profile="linux-voice-assistant") as device:
        ha = await connected(device)
        await streaming(device, ha)
        ha.event(EventType.STT_END, text="hello")
        await ha.barrier()
        assert device.state == State.AWAITING_RESPONSE
        await ha.close()


async def test_profile_keeps_overrides() -> None:
    """``EmulatedDevice(profile=..., **overrides)``: the profile, then the overrides."""
    async with EmulatedDevice(profile="atom-echo", name="desk", speed=2.0) as device:
        assert device.config.shared_bus and device.config.name == "desk"
        assert device.config.speed == 2.0
