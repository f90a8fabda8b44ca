"""The connection to one ESPHome satellite that this integration owns (duplex mode).

``EsphomeLink`` keeps an ``aioesphomeapi`` connection up (reconnects with backoff;
one warning when the device becomes unavailable, one info line when it is back),
subscribes to the voice assistant (the first subscriber owns it, DESIGN §5.5) and
turns each device-initiated start (the wake word) into a ``DuplexConversation``:

- the start is answered with port 0 (mic audio over the API connection);
- every mic chunk goes into the session, answer frames go to the device through
  an ``AnswerOutput`` chosen at connect time by the SPEAKER feature flag alone:
  raw API audio (``send_voice_assistant_audio``, ``ApiAudioOutput``) when the voice
  assistant has a ``speaker:`` (the firmware's ``on_audio`` plays only into that
  speaker, on every version), else a media-player announcement of a live HTTP
  stream served by HA (``duplex_stream.MediaStreamOutput``);
- while a session lives the link never sends an event that ends the mic stream
  (STT_VAD_END, TTS_END, RUN_END, ERROR, INTENT_PROGRESS with
  ``tts_start_streaming``); when the session ends by silence it sends RUN_END and
  the device returns to wake-word listening, while the conversation (its kernel
  child, its history) stays for the binding's ``idle_timeout_s``;
- on a board whose mic and speaker share one I2S bus (the project's half-duplex
  firmware: project name ``rtvoice.half-duplex``) an answer cannot play while the
  mic streams: ``HalfDuplexOutput`` releases the mic before the answer plays, and
  once it played the device listens again by itself (see there);
- a new start while a session lives is the wake word said again: the answer is cut
  (``wake_word_detected``) and the session goes on; a start while the conversation
  is idle opens a new session on the same child (the model sees the earlier turns);
- a stop from the device or a lost connection ends the session (the child stays
  idle, so a reconnect and a wake word continue the conversation); the idle timeout
  or ``aclose`` closes the conversation (no task left, the child handed off).
  Stock firmware says a wake word during an answer as such a stop and then a start
  (a barge-in by restart): the answer is cut where it was heard, the new start
  continues the same child, and what the user said before the new run listened is
  lost (the firmware clears its buffers entering ``START_MICROPHONE``);
- the project firmware (``firmware/packages``) offers API actions the link learns
  at connect (``list_entities_services``) and sends Home Assistant events it
  subscribes to (``subscribe_service_calls``): at its first run on a connection
  the link turns ``rtvoice_duplex`` on, and from then on a wake word, "stop" or
  the button during a run arrives as the event ``esphome.rtvoice_barge_in``
  without ending the run: the mic keeps streaming, no word is lost, the answer is
  cut and ``rtvoice_stop_speaker`` silences the speaker now (every cut answer
  calls it: ``ApiAudioOutput.stop``); a firmware that also offers
  ``rtvoice_silence_speaker`` and ``rtvoice_unmute_speaker`` is silenced already
  at a pause (a speech onset that may not be words), and a resumed answer is sent
  again from where the user stopped hearing it (``ApiAudioOutput.pause``);
- the firmware announces each start it makes itself (``esphome.rtvoice_start``),
  and ``request_start`` asks for one (``start_listening``): when no start request
  follows within ``LinkConfig.start_timeout``, another API client owns the voice assistant
  (the firmware refuses a second subscription with only a log line), which
  ``on_refused(True)`` reports (``on_refused(False)`` once a start arrives);
- ``send_timer_event`` passes HA's timer events on, as HA's esphome satellite does.

Version notes: aioesphomeapi 29.x calls ``handle_audio(data)``, 45+ calls
``handle_audio(data, data2)`` and passes handlers by keyword only: the handlers
accept ``*args``. ``execute_service`` returns None on 29.x and a coroutine on 46+
(``_execute`` runs it as a task). ESPHome ≥ 2026.1 never answers the login request of
``connect(login=True)`` (29.x): the link falls back to ``login=False`` after
``login_timeout`` and remembers it for reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
import contextlib
from dataclasses import dataclass, field
import functools
import inspect
import logging
from typing import Any, Protocol

from aioesphomeapi import (
    APIClient,
    APIConnectionError,
    DeviceInfo,
    HomeassistantServiceCall,
    InvalidAuthAPIError,
    InvalidEncryptionKeyAPIError,
    MediaPlayerCommand,
    MediaPlayerInfo,
    RequiresEncryptionAPIError,
    VoiceAssistantConfigurationResponse,
    VoiceAssistantEventType,
    VoiceAssistantFeature,
    VoiceAssistantTimerEventType,
)
from aioesphomeapi.model import UserService

from .duplex import DspWorker, SessionState, UtteranceSegmenter
from .duplex.audio import BYTES_PER_MS
from .duplex.player import PacedPlayer
from .duplex.tasks import wait_ended
from .duplex_link import DuplexBinding, DuplexConversation, warm_segmenter
from .duplex_stream import MediaStreamOutput, StreamOpener

_LOGGER = logging.getLogger(__name__)

CLIENT_INFO = "Home Assistant Realtime Voice"
API_AUDIO_PORT = 0  # answer a start with port 0: audio over the API connection
HALF_DUPLEX_PROJECT = ".half-duplex"  # packages/base.yaml: rtvoice.<half|full>-duplex
BUS_RELEASE_S = 0.25  # the mic and wake word let go of a shared I2S bus (assumed)
TAIL_AFTER_S = 0.04  # no answer frame for this long: the answer's last frame was sent
TAIL_FLUSH_MS = 200  # silence after it: pushes the firmware's buffer into the speaker
PUSH_MS = 60  # silence at a pause: moves the rest of the buffer behind the ring
KEEPALIVE_S = 0.3  # < the speaker's 500 ms idle stop (i2s_audio speaker ``timeout``)
API_AUDIO_URL = "rtvoice:api-audio"  # TTS_END needs a URL; a speaker: never fetches it
MAX_EARLY_AUDIO = 16000 * 2 * 5  # mic audio kept while the conversation opens (5 s)
# One VoiceAssistantAudio message: ESPHome sends 32-64 ms (1-2 KB); a bigger one is
# dropped whole, so the loop's work per message stays small (a 32 MB message blocked
# it for seconds).
MAX_MIC_MESSAGE = 16000 * 2 // 4  # 250 ms
ANNOUNCE_TIMEOUT = 15 * 60.0  # seconds an announcement may play (HA's esphome: same)
CONFIG_TIMEOUT = 10.0  # seconds for the voice assistant configuration to come back
# The project firmware's API actions and events (firmware/packages/voice.yaml).
ACTION_DUPLEX = "rtvoice_duplex"  # enabled: a barge-in is reported, not a restart
ACTION_STOP_SPEAKER = "rtvoice_stop_speaker"  # the speaker stops, drops its buffer
ACTION_SILENCE = "rtvoice_silence_speaker"  # mute, then stop: silent, queue dropped
ACTION_UNMUTE = "rtvoice_unmute_speaker"  # the next answer audio is heard again
# A resume after a silence goes back this far before the player's model of what
# was played, taken when the action left for the device (the model only grows
# until the device acts, so nothing is skipped while these cover the rest): the
# I2S speaker's DMA, 5 buffers of 10 ms always queued (i2s_audio_speaker_standard.cpp
# DMA_BUFFERS_COUNT x DMA_BUFFER_DURATION_MS), up to 26 ms until the stop takes
# effect (run_speaker_task leaves at its next DMA write, then loop() stops the
# driver), and the action's way to the device (Wi-Fi: a few ms, spikes of tens).
# The price: up to this much is heard twice.
OUTPUT_LAG_MS = 120
FLUSH_MS = 100  # muted silence after a silence: restarts the speaker, drains the buffer
ACTION_START_LISTENING = "start_listening"  # base.yaml: open the mic, no wake word
EVENT_BARGE_IN = "esphome.rtvoice_barge_in"  # trigger: wake_word, stop or button
EVENT_START = "esphome.rtvoice_start"  # the device requests a start right after

# Errors no retry will fix: the user must change the configuration.
FATAL_ERRORS = (
    InvalidAuthAPIError,
    InvalidEncryptionKeyAPIError,
    RequiresEncryptionAPIError,
)


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """Where the satellite is and how to talk to it."""

    host: str
    port: int = 6053
    noise_psk: str | None = field(default=None, repr=False)  # no repr, no log
    expected_name: str | None = None
    client_info: str = CLIENT_INFO
    login_timeout: float = 10.0  # then fall back to login=False (ESPHome >= 2026.1)
    start_timeout: float = 3.0  # a start the device announced must reach us by then
    backoff_min: float = 1.0
    backoff_max: float = 60.0


@dataclass(slots=True)
class MicStats:
    """What the link did with the device's mic messages (diagnostics)."""

    oversized: int = 0  # messages over MAX_MIC_MESSAGE, dropped
    odd: int = 0  # messages of an odd length, their last byte dropped


class AnswerOutput(Protocol):
    """Where one conversation's answer audio goes (one per conversation).

    ``send`` gets the session's paced frames (16 kHz mono s16le, real-time pace,
    ``lead_ms`` ahead); the link follows the session's states and calls the rest:
    ``pause`` (speech onset: the player sends nothing more), ``resume`` (a false
    barge-in: frames follow again), ``finish`` (the answer played to its end),
    ``stop`` (the answer was cut: drop what the device still holds).
    """

    async def send(self, frame: bytes) -> None:
        """Deliver one frame of answer audio to the device."""

    def pause(self) -> None:
        """No frame follows until ``resume`` (or ``stop``)."""

    def resume(self) -> None:
        """Frames follow again, continuing the paused answer."""

    def finish(self) -> None:
        """Close the answer: its last frame was played."""

    def stop(self) -> None:
        """Cut the answer: what the device still holds must not be heard."""

    async def aclose(self) -> None:
        """Stop what plays and release everything (the conversation is over)."""


class ApiAudioOutput:
    """Raw API audio (``send_voice_assistant_audio``) into a voice-assistant ``speaker:``.

    The firmware has no flush message, and outside STREAMING_RESPONSE it moves
    audio on only when a message arrives (``VoiceAssistant::on_audio`` ->
    ``write_speaker_``, at most 4 KiB, into an I2S ring of max(50 ms,
    ``buffer_duration``)): what the ring has no room for waits in the 16 KiB
    buffer, and the newest ~30-70 ms of an answer would wait there until the next
    message (the next answer's start). So after the last frame (none for
    ``TAIL_AFTER_S``) and at a cut the output sends ``TAIL_FLUSH_MS`` of silence at
    real-time pace, which pushes that audio out; a new frame ends the tail. Pause
    and resume send nothing: the device plays out what it holds.

    The speaker stops itself after 500 ms without data (``timeout``), and a stopped
    speaker refuses what arrives while it starts again (``play`` returns 0 until
    it runs): those bytes wait in the buffer, so every restart during a
    conversation would add its start latency to the delay for good, and the newest
    part of every answer would wait there (the part a cut cannot stop). From the
    session's start (``wake``: the speaker starts on silence, long before an
    answer) until it ends (``idle``) the output therefore sends 10 ms of silence
    whenever nothing was sent for ``KEEPALIVE_S``: the speaker never stops
    mid-conversation and an answer finds it running.

    On the project firmware with ``rtvoice_silence_speaker`` (``speaker.mute_on``
    then ``speaker.stop``) a pause silences the speaker at once: the I2S task ends
    and drops its ring and DMA, and what still waits in the 16 KiB buffer (the
    firmware has no way to clear it from outside) plays muted, pushed out by
    ``FLUSH_MS`` of silence that also restarts the speaker. The paused player goes
    back to what the user heard (``PacedPlayer.rewind``, ``OUTPUT_LAG_MS`` before
    its model's position when the action was sent: at most that much is heard
    twice, nothing is skipped).
    Before audio follows again (a resume, the next answer) the player is held
    until the flush has run and ``rtvoice_unmute_speaker`` was sent. A cut drops
    the rest as before (silencing first when the speaker was not silent).
    """

    keepalive = True
    silences = True  # may use rtvoice_silence_speaker when the firmware has it

    def __init__(self, link: EsphomeLink) -> None:
        """Send through ``link``'s current connection."""
        self._link = link
        self._frame_bytes = 320
        self._timer: asyncio.TimerHandle | None = None
        self._tail: asyncio.Task[None] | None = None
        self._alive: asyncio.TimerHandle | None = None
        self.player: PacedPlayer | None = None  # the live session's (``bind``)
        self._frames = 0  # answer frames sent
        self._silent_after: int | None = None  # ``_frames`` at the last silence
        self._silencing: asyncio.Task[None] | None = None  # the action, the flush
        self._silences_begun = 0
        self._unmuting: asyncio.Task[None] | None = None

    def bind(self, player: PacedPlayer) -> None:
        """Follow ``player`` (the session's; a resumed conversation has a new one)."""
        self.player = player

    @property
    def _silences(self) -> bool:
        return self.silences and self._link.silences_speaker

    async def send(self, frame: bytes) -> None:
        """Send one frame over the API connection (dropped when disconnected)."""
        self._end_tail()
        self._frame_bytes = len(frame) or self._frame_bytes
        self._frames += 1
        await self._send(frame)
        self._timer = asyncio.get_running_loop().call_later(
            TAIL_AFTER_S, self._start_tail
        )

    def wake(self) -> None:
        """Start the speaker on silence as a session starts, and keep it running."""
        if self.keepalive and self._alive is None:
            self._keep_alive()

    def idle(self) -> None:
        """Send nothing more: the session ended (the device frees its buffers)."""
        self._end_tail()
        if self._alive is not None:
            self._alive.cancel()
            self._alive = None

    async def _send(self, frame: bytes) -> None:
        silences = self._silences_begun
        await self._link._settle()  # noqa: SLF001 - the link's own output
        if self._silences_begun != silences:
            # A silence began while this frame waited: the device would drop it,
            # and the player goes back to what was heard. Nothing of the answer
            # reaches the device between a pause and its silence.
            return
        self._link._write_audio(frame)  # noqa: SLF001
        if self.keepalive:
            if self._alive is not None:
                self._alive.cancel()
            self._alive = asyncio.get_running_loop().call_later(
                KEEPALIVE_S, self._keep_alive
            )

    def _keep_alive(self) -> None:
        self._alive = None
        if self._tail is None or self._tail.done():
            self._tail = asyncio.get_running_loop().create_task(
                self._send(bytes(self._frame_bytes)), name="rtvoice speaker keepalive"
            )

    def pause(self) -> None:
        """No frame follows: silence the speaker now, or push out what waits.

        With ``rtvoice_silence_speaker`` the speaker is silenced and the paused
        player goes back to what was heard (see the class docstring). Else
        ``PUSH_MS`` of silence push out what waits in the buffer (the ring was full
        when the last frames came, about one frame): it plays right after the
        ring, not at the next message; the answer may resume.
        """
        self._end_unmute()
        if self.silence(rewind=True):
            return
        self._end_tail()
        self._tail = asyncio.get_running_loop().create_task(
            self._send_tail(PUSH_MS), name="rtvoice api audio push"
        )

    def silence(self, *, rewind: bool = False) -> bool:
        """Silence the speaker now (``rtvoice_silence_speaker``), then flush it muted.

        ``rewind``: once the action is on its way, the paused player goes back to
        what the user heard (``OUTPUT_LAG_MS`` before its model's position then).
        Nothing is called when no answer frame was sent since the last silence
        (the speaker is silent and muted already, the player where it was heard).
        False: the firmware has no such action, or no connection.
        """
        if not self._silences:
            return False
        if self._frames == (self._silent_after or 0) and (
            self._link.speaker_muted or self._silent_after is None
        ):
            return True  # silent already, or nothing of ours ever played
        if self._link.client is None:
            return False
        self._end_tail()
        self._silent_after = self._frames
        self._silences_begun += 1
        self._link.speaker_muted = True
        self._silencing = self._tail = asyncio.get_running_loop().create_task(
            self._silence(rewind), name="rtvoice speaker silence"
        )
        return True

    async def _silence(self, rewind: bool) -> None:
        sent = await self._link.call_action(ACTION_SILENCE)  # before the flush
        player = self.player
        if sent and rewind and player is not None and player.can_rewind:
            # Now, not at the pause: whatever delayed the action (a busy loop)
            # the device played on meanwhile, and the model with it.
            player.rewind(player.played_bytes() - OUTPUT_LAG_MS * BYTES_PER_MS)
        await self._send_tail(FLUSH_MS)

    def begin(self, player: PacedPlayer) -> None:
        """Unmute the speaker first when it was silenced (an answer starts)."""
        self.player = player
        self._unmute_first(player)

    def resume(self) -> None:
        """Frames follow: unmute the speaker first when it was silenced."""
        if self.player is not None:
            self._unmute_first(self.player)

    def _unmute_first(self, player: PacedPlayer) -> None:
        if not self._silences or not self._link.speaker_muted:
            return
        self._end_unmute()
        player.hold()  # before the player's task runs: no frame goes first
        self._unmuting = asyncio.get_running_loop().create_task(
            self._unmute(player), name="rtvoice speaker unmute"
        )

    async def _unmute(self, player: PacedPlayer) -> None:
        try:
            if (silencing := self._silencing) is not None and not silencing.done():
                await asyncio.wait((silencing,))  # muted: what waited has gone
            if await self._link.call_action(ACTION_UNMUTE):
                self._link.speaker_muted = False
        finally:
            # Not when ended from outside: a newer hold may be on the player by then.
            if self._unmuting is asyncio.current_task():
                self._unmuting = None
                player.release()

    def _end_unmute(self) -> None:
        unmuting, self._unmuting = self._unmuting, None
        if unmuting is not None:
            unmuting.cancel()
            if self.player is not None:
                self.player.release()

    def finish(self) -> None:
        """Nothing to do: the tail after the last frame has run or is running."""

    def stop(self) -> None:
        """Cut: silence the speaker (project firmware), else push out what waits.

        With ``rtvoice_silence_speaker`` or ``rtvoice_stop_speaker`` the device
        drops what its speaker holds; a firmware without them plays its lead out,
        and what waits in its buffer is pushed out now rather than at the start of
        the next answer.
        """
        self._end_unmute()
        if self.silence():
            return
        self._end_tail()
        if self._link.stops_speaker:
            self._link.stop_speaker()
            return
        self._start_tail()

    async def aclose(self) -> None:
        """End the tail, the keepalive and an unmute on its way."""
        self._end_unmute()
        self.idle()

    def _start_tail(self) -> None:
        self._timer = None
        if self._tail is None or self._tail.done():
            self._tail = asyncio.get_running_loop().create_task(
                self._send_tail(TAIL_FLUSH_MS), name="rtvoice api audio tail"
            )

    def _end_tail(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._tail is not None:
            self._tail.cancel()
            self._tail = None

    async def _send_tail(self, duration_ms: int) -> None:
        loop = asyncio.get_running_loop()
        silence = bytes(self._frame_bytes)
        frame_s = self._frame_bytes / (16000 * 2)
        start = loop.time()
        for index in range(max(1, round(duration_ms / 1000 / frame_s))):
            await self._send(silence)
            await asyncio.sleep(max(0.0, start + (index + 1) * frame_s - loop.time()))


class HalfDuplexOutput(ApiAudioOutput):
    """Raw API audio on a board whose mic and speaker share one I2S bus (Atom Echo).

    The microphone (the voice assistant's stream and micro_wake_word) holds the bus
    while it runs (``i2s_audio_microphone.cpp`` ``start_driver_``), so the speaker
    cannot start (``i2s_audio_speaker.cpp``: "Parent bus is busy", retried after
    1 s) and the 16 KiB buffer overflows. Before an answer plays (``begin``) the link
    releases the mic with the events HA's pipeline sends (``voice_assistant.cpp``
    ``on_event``): STT_VAD_END (STOP_MICROPHONE, then AWAITING_RESPONSE; the board's
    ``before_reply`` script stops micro_wake_word), INTENT_END with
    ``continue_conversation=1``, TTS_STREAM_START; the player is held
    ``BUS_RELEASE_S`` for the bus to come free. In AWAITING_RESPONSE the button's
    ``voice_assistant.stop`` reaches the link as a stop request: the answer is cut.
    When the answer has played (``finish``): TTS_STREAM_END, TTS_END, RUN_END: the
    firmware writes out the rest of its buffer (STREAMING_RESPONSE), waits for the
    speaker to stop itself (RESPONSE_FINISHED), then ``continue_conversation`` starts
    a new run, which the link takes as "listening again" (same session). A cut
    (``stop``: the device went away or the button) sends RUN_END only.
    """

    keepalive = False  # the speaker must stop: it frees the bus for the mic
    silences = False  # a cut ends the run: START_MICROPHONE clears the buffer

    def __init__(self, link: EsphomeLink) -> None:
        """Send through ``link``; it sends the events."""
        super().__init__(link)
        self._released = False
        self._hold: asyncio.TimerHandle | None = None

    def begin(self, player: PacedPlayer) -> None:
        """Release the mic as an answer starts; hold the player until the bus is free."""
        if self._released:
            return
        self._released = True
        self._link._release_mic()  # noqa: SLF001 - the link's own output
        player.pause()
        self._hold = asyncio.get_running_loop().call_later(BUS_RELEASE_S, player.resume)

    def finish(self) -> None:
        """Let the device play out the answer that played, then listen again."""
        self._end(played=True)

    def stop(self) -> None:
        """End the device's run: the answer was cut.

        No silence tail: the run ends and the next start clears the buffer
        (START_MICROPHONE), while a tail would start the speaker again and hold
        the shared bus (and the firmware's ``end_run``, waiting for the speaker
        to stop) until its 500 ms idle stop.
        """
        self._end_tail()
        if self._link.stops_speaker:
            self._link.stop_speaker()
        self._end(played=False)

    def _end(self, *, played: bool) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        if self._released:
            self._released = False
            self._link._answer_done(played=played)  # noqa: SLF001

    async def aclose(self) -> None:
        """End the hold and the tail."""
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        await super().aclose()


class _FollowedOutput:
    """Drives an ``AnswerOutput`` from its session's states (then reports them on)."""

    def __init__(
        self,
        output: AnswerOutput,
        on_state: Callable[[SessionState], None] | None,
    ) -> None:
        self.output = output
        # Its player is the live session's (a resumed conversation has a new one).
        self.conversation: DuplexConversation | None = None
        self._on_state = on_state
        self._state = SessionState.LISTENING

    def __call__(self, state: SessionState) -> None:
        previous, self._state = self._state, state
        output = self.output
        if (bind := getattr(output, "bind", None)) and self.conversation is not None:
            bind(self.conversation.session.player)
        begin = getattr(output, "begin", None)
        if (
            begin is not None
            and state is SessionState.SPEAKING
            and previous is SessionState.LISTENING
            and self.conversation is not None
        ):
            begin(self.conversation.session.player)  # before its first frame is sent
        if state is SessionState.PAUSED:
            output.pause()
        elif previous is SessionState.PAUSED and state in _PLAYING:
            output.resume()
        elif previous in _PLAYING or previous is SessionState.PAUSED:
            if state in (SessionState.LISTENING, SessionState.ENDED):
                # A natural end comes once the player's model says the device ran
                # dry; audio still queued there, or a pause, means the answer was cut.
                conversation = self.conversation
                queued = (
                    conversation.session.player.device_queued_bytes()
                    if conversation is not None
                    else 0
                )
                if queued or previous is SessionState.PAUSED:
                    output.stop()
                else:
                    output.finish()
        if state is SessionState.ENDED and (idle := getattr(output, "idle", None)):
            idle()
        if self._on_state is not None:
            self._on_state(state)


_PLAYING = (SessionState.SPEAKING, SessionState.RESUMING)


def plays_api_audio(info: DeviceInfo, api_version: Any) -> bool:
    """Return True when the voice assistant plays raw API audio: the SPEAKER flag.

    ESPHome's ``VoiceAssistant::on_audio`` (``voice_assistant.cpp``) copies API
    audio only into its ``speaker_``; a voice assistant with a ``media_player:``
    (the two exclude each other) drops it, whatever the firmware version.
    ``get_feature_flags()`` sets SPEAKER exactly when ``speaker_`` is set.
    """
    flags = (
        info.voice_assistant_feature_flags_compat(api_version)
        if api_version is not None
        else info.voice_assistant_feature_flags
    )
    return bool(flags & VoiceAssistantFeature.SPEAKER)


class EsphomeLink:
    """One ESPHome satellite: connection, voice assistant, duplex conversations.

    Not thread-safe: use from the event loop. ``start`` returns at once; ``aclose``
    ends everything the link started.
    """

    def __init__(
        self,
        config: LinkConfig,
        binding: DuplexBinding,
        *,
        zeroconf_instance: Any = None,
        on_available: Callable[[bool], None] | None = None,
        on_conversation: Callable[[DuplexConversation | None], None] | None = None,
        on_state: Callable[[SessionState], None] | None = None,
        streams: StreamOpener | None = None,
        on_refused: Callable[[bool], None] | None = None,
    ) -> None:
        """Bind the device's address to the duplex binding (kernel, STT, TTS).

        ``on_available(bool)`` follows connection changes; ``on_conversation``
        reports a conversation opening (and ``None`` when it closed); ``on_state``
        follows its session's state (listening, speaking, paused ...).
        ``streams`` serves answer streams to firmware without raw API audio (its
        media player fetches them); without it such a device gets API audio.
        ``on_refused(True)``: the device started listening for another API client
        (it owns the voice assistant); ``on_refused(False)``: a start came again.
        """
        self.config = config
        self.binding = binding
        self._zeroconf = zeroconf_instance
        self._on_available = on_available
        self._on_conversation = on_conversation
        self._on_state = on_state
        self._streams = streams
        self.media_player_key: int | None = None  # set: answers go to the media player
        self.half_duplex = False  # set: a shared I2S bus, the mic is released to play
        self._relisten = False  # the device will start again by itself (half duplex)
        self._outputs: dict[DuplexConversation, AnswerOutput] = {}
        self.client: APIClient | None = None
        self.device_info: DeviceInfo | None = None
        self.available = False
        self.login: bool | None = None  # learnt: does the device answer login?
        self.last_error: Exception | None = None
        self.conversation: DuplexConversation | None = None
        self._segmenter: UtteranceSegmenter | None = None
        self._dsp = DspWorker(f"rtvoice dsp {config.host}")  # the mic stream's DSP
        self._opening: asyncio.Task[None] | None = None
        self._early_audio = bytearray()
        self.mic_stats = MicStats()
        self._unsubscribe: Callable[[], None] | None = None
        self._runner: asyncio.Task[None] | None = None
        self._lost: asyncio.Event = asyncio.Event()
        self._connected = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._warned = False
        self._closed = False
        self._on_refused = on_refused
        self.services: dict[str, UserService] = {}  # the firmware's API actions
        self._duplex_on = False  # rtvoice_duplex turned on, this connection
        self._start_watch: asyncio.TimerHandle | None = None
        self.voice_refused = False  # a start went to another API client
        self.barge_in_events = 0  # esphome.rtvoice_barge_in events acted on
        self._speaker_silent = True  # no answer audio sent since the last stop
        self.speaker_muted = False  # rtvoice_silence_speaker muted it (this run)

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start connecting (and reconnecting) in the background."""
        if self._runner is None and not self._closed:
            self._runner = asyncio.get_running_loop().create_task(
                self._run(), name=f"rtvoice esphome {self.config.host}"
            )

    async def wait_connected(self) -> None:
        """Return once the device is connected and its voice assistant subscribed."""
        await self._connected.wait()

    @property
    def name(self) -> str:
        """The device's name (or its host until known)."""
        if self.device_info is not None and self.device_info.name:
            return self.device_info.name
        return self.config.host

    async def aclose(self) -> None:
        """Close the conversation, stop reconnecting, disconnect. No task is left."""
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        await self._end_conversation(send_run_end=True)
        # Conversations still closing (each close is shielded and bounded): wait.
        await wait_ended(self._tasks)
        await self._dsp.aclose()
        await self._disconnect()

    # --- connection ----------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.config.backoff_min
        while True:
            try:
                await self._connect()
            except asyncio.CancelledError:
                await self._disconnect()
                raise
            except (APIConnectionError, OSError, TimeoutError) as err:
                await self._disconnect()
                task = asyncio.current_task()
                if self._closed or (task is not None and task.cancelling()):
                    # aioesphomeapi turns a cancel inside connect() into
                    # APIConnectionCancelledError: it is still our cancel.
                    raise asyncio.CancelledError from err
                self._set_unavailable(err)
                if isinstance(err, FATAL_ERRORS):  # needs the user: retry rarely
                    delay = self.config.backoff_max
                await asyncio.sleep(delay)  # backoff, not synchronisation
                delay = min(delay * 2, self.config.backoff_max)
                continue
            delay = self.config.backoff_min
            self._set_available()
            await self._lost.wait()
            self._connected.clear()
            await self._end_session()
            await self._disconnect()
            self._set_unavailable(None)

    async def _connect(self) -> None:
        if self.login is not False:
            client, lost = self._new_client()
            login_timeout = asyncio.timeout(self.config.login_timeout)
            try:
                async with login_timeout:
                    await client.connect(on_stop=_setter(lost), login=True)
            except (TimeoutError, APIConnectionError):
                await _force_disconnect(client)
                if not login_timeout.expired():
                    raise
                _LOGGER.debug(
                    "%s did not answer the login; connecting without it",
                    self.config.host,
                )
            except BaseException:
                await _force_disconnect(client)
                raise
            else:
                self.login = True
                await self._connected_as(client, lost)
                return
        client, lost = self._new_client()
        try:
            await client.connect(on_stop=_setter(lost), login=False)
        except BaseException:
            await _force_disconnect(client)
            raise
        self.login = False
        await self._connected_as(client, lost)

    def _new_client(self) -> tuple[APIClient, asyncio.Event]:
        """Return a client and the event its loss of connection sets."""
        config = self.config
        client = APIClient(
            config.host,
            config.port,
            None,
            client_info=config.client_info,
            noise_psk=config.noise_psk,
            expected_name=config.expected_name,
            zeroconf_instance=self._zeroconf,
        )
        return client, asyncio.Event()

    async def _connected_as(self, client: APIClient, lost: asyncio.Event) -> None:
        self.client = client
        self._lost = lost
        try:
            self.device_info = await client.device_info()
            await self._choose_output(client)
            if self._segmenter is None:
                self._segmenter = await warm_segmenter()
            self._unsubscribe = client.subscribe_voice_assistant(
                handle_start=self._handle_start,
                handle_stop=self._handle_stop,
                handle_audio=self._handle_audio,
            )
            await self._follow_firmware(client)
        except BaseException:
            await self._disconnect()
            raise
        if self._lost.is_set():
            raise APIConnectionError("connection lost while subscribing")

    async def _disconnect(self) -> None:
        self._connected.clear()
        self._forget_firmware()
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        client, self.client = self.client, None
        if unsubscribe is not None:
            with contextlib.suppress(APIConnectionError):
                unsubscribe()
        if client is not None:
            await _force_disconnect(client)

    def _set_available(self) -> None:
        self.last_error = None
        self.available = True
        self._connected.set()
        if self._warned:
            _LOGGER.info("ESPHome satellite %s is available again", self.name)
        self._warned = False
        if self._on_available is not None:
            self._on_available(True)

    def _set_unavailable(self, err: Exception | None) -> None:
        if err is not None:
            self.last_error = err
        was_available, self.available = self.available, False
        if not self._warned:
            self._warned = True
            # The error's type only: messages may carry addresses or key material.
            _LOGGER.warning(
                "ESPHome satellite %s is unavailable%s",
                self.name,
                f" ({type(err).__name__})" if err is not None else "",
            )
        if was_available and self._on_available is not None:
            self._on_available(False)

    # --- voice assistant callbacks (aioesphomeapi) ----------------------------------

    async def _handle_start(self, *args: Any) -> int | None:
        """Device-initiated start (wake word): a new or continued conversation."""
        self._start_arrived()
        conversation = self.conversation
        if self._relisten and conversation is not None and not conversation.ended:
            # Half duplex: the answer played, continue_conversation restarted the mic.
            self._relisten = False
            self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_START, {})
            self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_STT_START, {})
            return API_AUDIO_PORT
        self._relisten = False
        if conversation is not None and not conversation.ended:
            conversation.session.wake_word_detected()
            return API_AUDIO_PORT
        if self._opening is not None and not self._opening.done():
            return API_AUDIO_PORT  # a repeated wake word while opening: same one
        if self.client is None:
            return None
        if conversation is not None and conversation.resume():
            # Idle: a new session on the same child; no await since the check.
            self._run_started(conversation)
            return API_AUDIO_PORT
        self._early_audio.clear()
        self._opening = self._spawn(self._open_conversation(), "open conversation")
        return API_AUDIO_PORT

    async def _handle_stop(self, *args: Any) -> None:
        """Handle a stop: ``start=False`` (abort=True) or the end of the audio."""
        abort = bool(args[0]) if args else True
        if abort:
            await self._end_session()
        # end=True of the audio: the session segments speech itself; nothing to do.

    async def _handle_audio(self, *args: Any) -> None:
        """Mic audio: ``(data)`` on aioesphomeapi 29.x, ``(data, data2)`` on 45+."""
        if not args:
            return
        data = self._mic_message(args[0])
        if not data:
            return
        # MULTI_CHANNEL_AUDIO: the second channel is the device's echo reference
        # (cut as the mic message was).
        reference = args[1][: len(data)] if len(args) > 1 and args[1] else None
        conversation = self.conversation
        if conversation is not None and reference is not None:
            conversation.session.feed_mic(data, reference)
        elif conversation is not None:
            conversation.session.feed_mic(data)
        elif self._opening is not None and not self._opening.done():
            if len(self._early_audio) + len(data) <= MAX_EARLY_AUDIO:
                self._early_audio += data

    @property
    def dsp_dropped(self) -> int:
        """Mic chunks the DSP worker dropped (audio faster than real time)."""
        return self._dsp.dropped

    def _mic_message(self, data: bytes) -> bytes:
        """Return a message's mic audio as whole 16-bit samples; b"" to drop it.

        Each message is framed on its own: an odd byte at its end is dropped, so
        one odd-sized message does not shift every later sample (high and low
        bytes swapped: loud noise). A message over ``MAX_MIC_MESSAGE`` is dropped.
        """
        if len(data) > MAX_MIC_MESSAGE:
            self.mic_stats.oversized += 1
            return b""
        if len(data) % 2:
            self.mic_stats.odd += 1
            return data[:-1]
        return data

    # --- conversations ----------------------------------------------------------------

    async def _open_conversation(self) -> None:
        conversation = await self._new_conversation(self.binding)
        if self.client is None or self._closed:
            await self._release(conversation)
            return
        previous, self.conversation = self.conversation, conversation
        if previous is not None:  # closing already (a wake word raced its close)
            self._spawn(self._release(previous), "end conversation")
        early, self._early_audio = bytes(self._early_audio), bytearray()
        self._run_started(conversation, early)

    async def _new_conversation(self, binding: DuplexBinding) -> DuplexConversation:
        if self._segmenter is None:
            self._segmenter = await warm_segmenter()
        followed = _FollowedOutput(self._new_output(), self._on_state)
        conversation = await DuplexConversation.open(
            binding,
            name=self.name,
            send=followed.output.send,
            segmenter=self._segmenter,
            on_end=self._session_ended,
            on_state=followed,
            dsp=self._dsp,
            on_close=self._conversation_closed,
        )
        followed.conversation = conversation
        self._outputs[conversation] = followed.output
        return conversation

    async def open_waiting(
        self, binding: DuplexBinding | None = None
    ) -> DuplexConversation:
        """Open a conversation that waits, idle, for the device's next start.

        For ``start_conversation``: the conversation (its id, what was said) exists
        before the device listens, and the device's start resumes it. The current
        conversation is closed first (hand-off). ``binding`` replaces the link's
        own for this conversation (e.g. another system prompt). Raises
        ``APIConnectionError`` when the device is not connected.
        """
        if self.client is None or not self.available:
            raise APIConnectionError(f"{self.name} is not connected")
        await self._end_conversation(send_run_end=True)
        conversation = await self._new_conversation(binding or self.binding)
        conversation.end_session()  # no session until the device starts
        if self.client is None or self._closed:
            await self._release(conversation)
            raise APIConnectionError(f"{self.name} is not connected")
        previous, self.conversation = self.conversation, conversation
        if previous is not None:  # a wake word opened one meanwhile
            self._spawn(self._release(previous), "end conversation")
        if self._on_conversation is not None:
            self._on_conversation(conversation)
        return conversation

    async def close_conversation(self, conversation: DuplexConversation) -> None:
        """Close ``conversation`` (hand-off); a live session's device stops listening."""
        if self.conversation is conversation:
            self.conversation = None
            if not conversation.ended:
                self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_END, {})
        await self._release(conversation)

    def _run_started(
        self, conversation: DuplexConversation, early: bytes = b""
    ) -> None:
        """Tell the device its run started; feed the audio that came meanwhile."""
        self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_START, {})
        self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_STT_START, {})
        self.speaker_muted = False  # the firmware's on_start: speaker.mute_off
        output = self._outputs.get(conversation)
        if (wake := getattr(output, "wake", None)) is not None:
            wake()  # the device allocated its buffers at this start
        if early:
            conversation.session.feed_mic(early)
        if self._on_conversation is not None:
            self._on_conversation(conversation)

    def _session_ended(self) -> None:
        """Silence after the last answer: back to wake-word listening.

        The conversation stays (idle, the child keeps its history): a wake word
        within the binding's idle timeout resumes it.
        """
        # The only event that ends the mic stream, sent once the session is over.
        self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_END, {})

    def _conversation_closed(self, conversation: DuplexConversation) -> None:
        """Detach ``conversation`` (the idle timeout began its close) and await the close."""
        if self.conversation is conversation:
            self.conversation = None
        self._spawn(self._release(conversation), "end conversation")

    async def _release(self, conversation: DuplexConversation) -> None:
        await conversation.aclose()
        if (output := self._outputs.pop(conversation, None)) is not None:
            await output.aclose()
        if self.conversation is None and self._on_conversation is not None:
            self._on_conversation(None)  # not when a newer one opened meanwhile

    async def _end_session(self) -> None:
        """End the session (the device went away or aborted); the child stays, idle."""
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
        self._early_audio.clear()
        if self.conversation is not None:
            self.conversation.end_session()

    async def _end_conversation(self, *, send_run_end: bool) -> None:
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
        self._early_audio.clear()
        conversation, self.conversation = self.conversation, None
        if conversation is None:
            return
        if send_run_end and not conversation.ended:  # idle: the device is back already
            self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_END, {})
        await self._release(conversation)

    # --- answer output ------------------------------------------------------------

    async def _choose_output(self, client: APIClient) -> None:
        """Pick where answers go on this connection (firmware and media player)."""
        self.media_player_key = None
        self.half_duplex = False
        self._relisten = False
        info = self.device_info
        if info is None:
            return
        if plays_api_audio(info, client.api_version):
            self.half_duplex = shares_i2s_bus(info)
            return
        if self._streams is None:
            return
        entities, _services = await client.list_entities_services()
        for entity in entities:
            if isinstance(entity, MediaPlayerInfo):
                self.media_player_key = entity.key
                _LOGGER.debug(
                    "%s (ESPHome %s) plays answers through its media player",
                    self.name,
                    info.esphome_version,
                )
                return
        _LOGGER.warning(
            "ESPHome satellite %s (ESPHome %s) has neither a voice assistant speaker"
            " nor a media player: answers are sent as raw audio it will not play",
            self.name,
            info.esphome_version,
        )

    def _new_output(self) -> AnswerOutput:
        """Return the output of a new conversation, as chosen at connect time."""
        if self.media_player_key is not None and self._streams is not None:
            return MediaStreamOutput(
                self._streams,
                play=functools.partial(self._media_command, announce=True),
                stop=functools.partial(self._media_command, None),
                peer=self.config.host,  # its streams serve the device's address only
            )
        if self.half_duplex:
            return HalfDuplexOutput(self)
        return ApiAudioOutput(self)

    def _release_mic(self) -> None:
        """Half duplex: end the utterance so the firmware frees the I2S bus."""
        self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_STT_VAD_END, {})
        self._send_event(
            VoiceAssistantEventType.VOICE_ASSISTANT_INTENT_END,
            {"continue_conversation": "1"},
        )
        self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_TTS_STREAM_START, {})

    def _answer_done(self, *, played: bool) -> None:
        """Half duplex: the answer ended; played: listen again, else end the run."""
        if played:
            self._relisten = True
            self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_TTS_STREAM_END, {})
            self._send_event(
                VoiceAssistantEventType.VOICE_ASSISTANT_TTS_END, {"url": API_AUDIO_URL}
            )
        self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_END, {})

    def _media_command(self, url: str | None, *, announce: bool = True) -> None:
        """Play ``url`` as an announcement on the media player, or stop it (None)."""
        client, key = self.client, self.media_player_key
        if client is None or key is None:
            return
        with contextlib.suppress(APIConnectionError):
            if url is None:
                client.media_player_command(
                    key, command=MediaPlayerCommand.STOP, announcement=True
                )
            else:
                client.media_player_command(key, media_url=url, announcement=announce)

    async def _settle(self) -> None:
        """Return one loop iteration later: a connection lost by now is known.

        A write that fails (the device reset the connection) closes asyncio's
        transport at once, but aioesphomeapi hears of it only on the next
        iteration; a frame sent in between reaches ``writelines``, which in the
        CPython 3.13 we run does not check for a lost connection
        (python/cpython#136234): it leaves a writer registered for the socket's
        fd, the socket closes, and the next socket given that fd number (our
        reconnect, or any connection in Home Assistant) waits for a writability
        epoll never reports (our reconnect hung for aioesphomeapi's 60 s connect
        timeout). After the yield aioesphomeapi knows, and refuses.
        """
        await asyncio.sleep(0)

    def _write_audio(self, frame: bytes) -> None:
        client = self.client
        if client is None:
            return  # the connection is gone; the conversation is being closed
        try:
            client.send_voice_assistant_audio(frame)
        except APIConnectionError:
            return
        self._speaker_silent = False

    def _send_event(
        self, event: VoiceAssistantEventType, data: dict[str, str] | None
    ) -> None:
        client = self.client
        if client is None:
            return
        with contextlib.suppress(APIConnectionError):
            client.send_voice_assistant_event(event, data)

    def _spawn(self, coro: Any, what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"rtvoice {what}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            _LOGGER.error(
                "Duplex conversation on %s failed: %s", self.name, type(err).__name__
            )

    # --- the project firmware: its actions and events ------------------------------

    async def _follow_firmware(self, client: APIClient) -> None:
        """Learn the firmware's API actions; follow the events it sends."""
        _entities, services = await client.list_entities_services()
        self.services = {service.name: service for service in services}
        self._duplex_on = False
        client.subscribe_service_calls(self._handle_device_event)

    def _forget_firmware(self) -> None:
        self.services = {}
        self._duplex_on = False
        self._speaker_silent = True  # a device that lost its client stops playing
        self.speaker_muted = False  # on_client_disconnected: speaker.mute_off
        if (watch := self._start_watch) is not None:
            self._start_watch = None
            watch.cancel()

    def _handle_device_event(self, call: HomeassistantServiceCall) -> None:
        """Act on a ``homeassistant.event`` of the device (actions are not ours)."""
        if not call.is_event:
            return
        if call.service == EVENT_BARGE_IN:
            self._device_barge_in(str(call.data.get("trigger", "")))
        elif call.service == EVENT_START:
            if self.voice_refused:
                self._resubscribe()  # the other client may have gone meanwhile
            self._expect_start()

    def _device_barge_in(self, trigger: str) -> None:
        """Wake word, "stop" or button during the run: cut the answer, keep listening."""
        conversation = self.conversation
        if conversation is None or conversation.ended:
            return
        self.barge_in_events += 1
        _LOGGER.debug("%s: barge-in by %s", self.name, trigger or "the device")
        # The device's queue is not in the player's model (ring, DMA, start
        # latency): whatever was sent may still play, so stop it in any case.
        output = self._outputs.get(conversation)
        silence = getattr(output, "silence", None)
        if silence is None or not silence():
            self.stop_speaker()
        conversation.session.wake_word_detected()

    @property
    def stops_speaker(self) -> bool:
        """Whether the firmware offers ``rtvoice_stop_speaker`` (the project's)."""
        return ACTION_STOP_SPEAKER in self.services

    @property
    def silences_speaker(self) -> bool:
        """Whether the firmware can silence at a pause and unmute again (the project's)."""
        return ACTION_SILENCE in self.services and ACTION_UNMUTE in self.services

    async def call_action(self, name: str, data: dict[str, Any] | None = None) -> bool:
        """Run the firmware's API action ``name``, sent once this returns; False: none."""
        client, service = self.client, self.services.get(name)
        if client is None or service is None:
            return False
        execute: Callable[..., Any] = client.execute_service
        try:
            # None on aioesphomeapi 29.x (sent); a coroutine that sends on 46+.
            sent = execute(service, data or {})
            if inspect.isawaitable(sent):
                await sent
        except APIConnectionError:
            return False
        return True

    def stop_speaker(self) -> bool:
        """Silence the device's speaker now (``rtvoice_stop_speaker``); False: none.

        Once per stretch of answer audio: nothing sent since the last stop, nothing
        to stop.
        """
        if self._speaker_silent:
            return False
        if not self._execute(ACTION_STOP_SPEAKER, {}):
            return False
        self._speaker_silent = True
        return True

    def request_start(self) -> bool:
        """Ask the device to listen now (``start_listening``); False: not offered.

        A start request that does not follow within ``start_timeout`` went to
        another API client: ``on_refused(True)``.
        """
        if not self._execute(ACTION_START_LISTENING, {}):
            return False
        self._expect_start()
        return True

    def _resubscribe(self) -> None:
        """Subscribe to the voice assistant again (the firmware takes a free one)."""
        client = self.client
        if client is None:
            return
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        with contextlib.suppress(APIConnectionError):
            if unsubscribe is not None:
                unsubscribe()
            self._unsubscribe = client.subscribe_voice_assistant(
                handle_start=self._handle_start,
                handle_stop=self._handle_stop,
                handle_audio=self._handle_audio,
            )

    def _enable_duplex(self) -> None:
        """Have the firmware report barge-ins instead of restarting (once per connection)."""
        if not self._duplex_on:
            self._duplex_on = self._execute(ACTION_DUPLEX, {"enabled": True})

    def _execute(self, name: str, data: dict[str, Any]) -> bool:
        """Run the firmware's API action ``name`` now; False when it has none."""
        client, service = self.client, self.services.get(name)
        if client is None or service is None:
            return False
        execute: Callable[..., Any] = client.execute_service
        try:
            # None on aioesphomeapi 29.x; a coroutine (it sends) on 46+.
            sent = execute(service, data)
        except APIConnectionError:
            return False
        if inspect.isawaitable(sent):
            self._spawn(sent, f"action {name}")
        return True

    def _expect_start(self) -> None:
        """Watch for the start on its way: it must come within ``start_timeout``."""
        if self._start_watch is None and not self._closed:
            self._start_watch = asyncio.get_running_loop().call_later(
                self.config.start_timeout, self._start_missing
            )

    def _start_missing(self) -> None:
        self._start_watch = None
        if self.voice_refused:
            return
        self.voice_refused = True
        _LOGGER.warning(
            "ESPHome satellite %s started listening for another API client: it"
            " serves one voice assistant client, and that is not Realtime Voice",
            self.name,
        )
        if self._on_refused is not None:
            self._on_refused(True)

    def _start_arrived(self) -> None:
        """Note a start request: this link owns the voice assistant."""
        if (watch := self._start_watch) is not None:
            self._start_watch = None
            watch.cancel()
        self._enable_duplex()
        if self.voice_refused:
            self.voice_refused = False
            _LOGGER.info(
                "ESPHome satellite %s listens for Realtime Voice again", self.name
            )
            if self._on_refused is not None:
                self._on_refused(False)

    def send_timer_event(
        self,
        *,
        event_type: VoiceAssistantTimerEventType,
        timer_id: str,
        name: str | None,
        total_seconds: int,
        seconds_left: int,
        is_active: bool,
    ) -> None:
        """Pass a timer event on (as HA's esphome ``handle_timer_event``); dropped offline."""
        client = self.client
        if client is None:
            return
        with contextlib.suppress(APIConnectionError):
            client.send_voice_assistant_timer_event(
                event_type, timer_id, name, total_seconds, seconds_left, is_active
            )

    # --- announcements and configuration (the satellite entity) --------------------

    @property
    def voice_assistant_features(self) -> int:
        """``VoiceAssistantFeature`` flags of the connected device (0 until known)."""
        info, client = self.device_info, self.client
        if info is None or client is None or client.api_version is None:
            return 0
        return int(info.voice_assistant_feature_flags_compat(client.api_version))

    async def announce(
        self,
        media_id: str,
        text: str = "",
        *,
        preannounce_media_id: str = "",
        start_conversation: bool = False,
        keep_conversation: bool = False,
        timeout: float = ANNOUNCE_TIMEOUT,
    ) -> None:
        """Have the device play ``media_id`` (a URL it fetches); return once played.

        A live conversation is closed first (RUN_END: the device stops streaming
        its mic, then plays); its transcript keeps what was heard. With
        ``start_conversation`` the device starts listening once the announcement
        has played, and that start opens a new conversation. Raises
        ``APIConnectionError`` when the device is not connected, ``TimeoutError``
        when it does not report the announcement finished in time.
        ``keep_conversation``: only a live session ends; the conversation stays,
        idle, and the device's next start (``start_conversation``, a wake word)
        resumes it.
        """
        if self.client is None or not self.available:
            raise APIConnectionError(f"{self.name} is not connected")
        if not keep_conversation:
            await self._end_conversation(send_run_end=True)
        elif (conversation := self.conversation) is not None and not conversation.ended:
            self._send_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_END, {})
            conversation.end_session()
        client = self.client
        if client is None:
            raise APIConnectionError(f"{self.name} is not connected")
        await client.send_voice_assistant_announcement_await_response(
            media_id,
            timeout,
            text,
            preannounce_media_id=preannounce_media_id,
            start_conversation=start_conversation,
        )

    async def voice_assistant_configuration(
        self, timeout: float = CONFIG_TIMEOUT
    ) -> VoiceAssistantConfigurationResponse:
        """Return the device's wake words: available, active, how many may be."""
        client = self.client
        if client is None:
            raise APIConnectionError(f"{self.name} is not connected")
        return await client.get_voice_assistant_configuration(timeout)

    async def set_active_wake_words(self, wake_word_ids: list[str]) -> None:
        """Make exactly these wake words active on the device (no answer comes)."""
        client = self.client
        if client is None:
            raise APIConnectionError(f"{self.name} is not connected")
        await client.set_voice_assistant_configuration(list(wake_word_ids))

    @property
    def session_state(self) -> SessionState | None:
        """State of the live conversation's session, if any."""
        return self.conversation.session.state if self.conversation else None


def shares_i2s_bus(info: DeviceInfo) -> bool:
    """Return True for the project's half-duplex firmware (one I2S bus, e.g. Atom Echo).

    ``packages/base.yaml`` names the project ``rtvoice.<audio_duplex>-duplex``, set by
    the board's duplex package; other firmware is taken as full duplex.
    """
    return bool(info.project_name) and info.project_name.endswith(HALF_DUPLEX_PROJECT)


def _setter(event: asyncio.Event) -> Callable[[bool], Coroutine[Any, Any, None]]:
    """Return an ``on_stop`` callback that sets ``event`` (one per client)."""

    async def on_stop(expected_disconnect: bool) -> None:
        event.set()

    return on_stop


async def _force_disconnect(client: APIClient) -> None:
    with contextlib.suppress(APIConnectionError, OSError):
        await client.disconnect(force=True)
