"""The voice assistant as ESPHome firmware runs it (``voice_assistant.cpp``).

States follow the firmware's: ``IDLE`` -> (start) ``STARTING_PIPELINE`` (request sent, the
mic already captures into a 512 ms ring buffer) -> (response, port 0) ``STREAMING_MICROPHONE``
-> (STT_VAD_END / end of utterance) ``AWAITING_RESPONSE`` -> (TTS_END, or INTENT_PROGRESS
with ``tts_start_streaming``) ``STREAMING_RESPONSE`` -> playback finished ->
``IDLE``, or a new run in the same conversation when the answer set
``continue_conversation`` (or the announcement asked to ``start_conversation``).

Only the first subscribed API connection owns the voice assistant; messages from other
connections are ignored (a configuration request from them gets an empty answer).

With ``DeviceConfig.firmware_speaker`` raw API audio goes through ``i2s.SpeakerPath``
(``VoiceAssistant::on_audio`` / ``write_speaker_``; the loop writes it on only in
STREAMING_RESPONSE and RESPONSE_FINISHED), the mic and micro_wake_word hold their I2S
bus while they run (``i2s_audio_microphone.cpp``), and the answer ends as
``VoiceAssistant::loop`` RESPONSE_FINISHED does: once the buffer is written out and
the speaker stopped itself (idle ``timeout``), then ``clear_buffers_`` and a new run
when ``continue_conversation_`` is set. The board scripts of ``packages/voice.yaml`` /
``half-duplex.yaml`` that matter on the wire are modelled with
``DeviceConfig.half_duplex_scripts`` (see there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
import contextlib
import logging
from typing import Any

from aioesphomeapi import api_pb2
from google.protobuf.message import Message

from .config import DeviceConfig, Feature
from .i2s import Bus, SpeakerPath
from .mic import Frame, Microphone, mic_clock
from .record import Entry, Kind, Record
from .runs import (
    IGNORED_ERRORS,
    STOPPING_ERRORS,
    USE_VAD,
    USE_WAKE_WORD,
    Client,
    EventType,
    Interrupt,
    Run,
    State,
)
from .speaker import PCM16K, Playback, Speaker

_LOGGER = logging.getLogger(__name__)

LOOP_S = 0.016  # ESPHome's main loop interval (``App.set_loop_interval(16)``)
MIC_RELEASE_S = (
    0.032  # STOP_MICROPHONE -> STOPPING_MICROPHONE -> driver stopped (assumed)
)
_HAS_DATA2 = "data2" in api_pb2.VoiceAssistantAudio.DESCRIPTOR.fields_by_name


class VoiceAssistant:
    """Device-side voice assistant state machine."""

    def __init__(
        self,
        config: DeviceConfig,
        record: Record,
        speaker: Callable[[], Speaker],
        on_media_state: Callable[[bool], None],
    ) -> None:
        """Wire the state machine to the record, speaker and media player entity."""
        self._config = config
        self._record = record
        self._speaker = speaker
        self._on_media_state = on_media_state
        self._loop = asyncio.get_running_loop()
        self.mic = Microphone()
        self.owner: Client | None = None
        self.state = State.IDLE
        self.runs: list[Run] = []
        self.playbacks: list[Playback] = []
        self.timers: dict[str, api_pb2.VoiceAssistantTimerEventResponse] = {}
        self.active_wake_words = list(config.active_wake_words)
        self.conversation_id = ""
        self.continue_conversation = False
        self.wake_word_phrase = ""
        self._tts_url = ""
        self._started_streaming_tts = False
        self._ring: list[Frame] = []
        self._mic_task: asyncio.Task[None] | None = None
        self._play_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.errors: list[BaseException] = []
        """Exceptions raised inside the emulator's own tasks (a bug if not empty)."""
        self._api_playback: Playback | None = None
        self._stream_end_seen = False
        self.end_after_speech = False
        """Send ``VoiceAssistantAudio(end=True)`` right after the last speech frame."""
        self.mic_bus = Bus("i2s_mic")
        self.speaker_path: SpeakerPath | None = None
        if config.firmware_speaker and config.features & Feature.SPEAKER:
            bus = self.mic_bus if config.shared_bus else Bus("i2s_speaker")
            self.speaker_path = SpeakerPath(
                bus,
                ring_ms=config.speaker_buffer_ms,
                speed=config.speed,
                note=lambda what: self._record.add(Kind.NOTE, what=what),
            )
        self.wake_word_running = False
        """micro_wake_word runs (it holds the mic, and so a shared bus)."""
        self._mic_streaming = False
        self._release: asyncio.TimerHandle | None = None
        self._response_task: asyncio.Task[None] | None = None
        self.on_start: list[Callable[[], None]] = []
        """The YAML's ``on_start`` automations (``start_trigger_``, at RUN_START)."""

    # -- helpers ---------------------------------------------------------------

    @property
    def run(self) -> Run | None:
        """The latest run."""
        return self.runs[-1] if self.runs else None

    def _set_state(self, state: State) -> None:
        if state != self.state:
            self.state = state
            self._record.add(Kind.STATE, state=str(state))
            if state == State.IDLE and self.speaker_path is not None:
                self.speaker_path.free()  # loop() IDLE: deallocate_buffers_()

    # -- the mic's hold on its I2S bus -------------------------------------------

    def _hold_mic(self) -> None:
        """Take the mic's bus: it runs (``start_driver_``: ``try_lock``)."""
        if self._release is not None:
            self._release.cancel()
            self._release = None
        if not self.mic_bus.try_lock("mic"):
            self._record.add(Kind.NOTE, what="mic waits for the I2S bus")

    def _maybe_release_mic(self) -> None:
        """Neither the VA stream nor micro_wake_word listens: the bus is free soon."""
        if self._mic_streaming or self.wake_word_running or self._release is not None:
            return

        def release() -> None:
            self._release = None
            if not (self._mic_streaming or self.wake_word_running):
                self.mic_bus.unlock("mic")
                self._record.add(Kind.NOTE, what="mic released the I2S bus")

        self._release = self._loop.call_later(
            MIC_RELEASE_S / self._config.speed, release
        )

    def start_wake_word(self) -> None:
        """``micro_wake_word.start`` (on client connect; after the run, half duplex)."""
        if self._config.micro_wake_word and not self.wake_word_running:
            self.wake_word_running = True
            self._hold_mic()

    def stop_wake_word(self) -> None:
        """``micro_wake_word.stop``."""
        if self.wake_word_running:
            self.wake_word_running = False
            self._maybe_release_mic()

    def _send(self, message: Message) -> bool:
        if self.owner is None:
            return False
        self.owner.send(message)
        return True

    def _end_run(self, reason: str) -> None:
        run = self.run
        if run is not None and not run.ended.is_set():
            run.ended_at = self._loop.time()
            run.end_reason = reason
            run.ended.set()

    def signal_stop(self) -> None:
        """Tell the client to abort: ``VoiceAssistantRequest(start=False)``."""
        self._send(api_pb2.VoiceAssistantRequest(start=False))

    # -- subscription ----------------------------------------------------------

    def subscribe(self, client: Client, subscribe: bool) -> None:
        """First subscriber owns the voice assistant; later ones are ignored."""
        if not subscribe:
            if self.owner is client:
                self.owner = None
                self._record.add(
                    Kind.VOICE_OWNER, connection=client.number, owner=False
                )
                self._shutdown("unsubscribed")
            return
        if self.owner is not None:
            self._record.add(
                Kind.NOTE,
                connection=client.number,
                what="voice assistant already owned; subscription ignored",
            )
            return
        self.owner = client
        self._record.add(Kind.VOICE_OWNER, connection=client.number, owner=True)
        self.start_wake_word()  # on_client_connected: micro_wake_word.start

    def client_gone(self, client: Client) -> None:
        """Release ownership when a connection closed and stop everything, as firmware does."""
        if self.owner is client:
            self.owner = None
            self._record.add(Kind.VOICE_OWNER, connection=client.number, owner=False)
            self._shutdown("disconnected")

    def _shutdown(self, reason: str) -> None:
        self.stop_wake_word()  # on_client_disconnected: micro_wake_word.stop
        self._stop_mic(reason)
        self._stop_playback()
        self.continue_conversation = False
        self._set_state(State.IDLE)
        self._end_run(reason)

    # -- starting runs ---------------------------------------------------------

    def wake(
        self,
        wake_word_phrase: str,
        *,
        conversation_id: str | None = None,
        interrupt: Interrupt = Interrupt.FIRMWARE,
    ) -> Run | None:
        """Hear the wake word; return the run it started, if any.

        Idle: a run starts. Busy, by ``interrupt``: ``FIRMWARE`` does what stock Voice PE
        firmware does (``voice_assistant.start`` only acts when idle; while the answer
        plays, the wake word stops that playback, which reports the announcement
        finished); ``RESTART`` sends a new start request right away (the client then
        cancels its running pipeline); ``STOP_FIRST`` sends ``start=False`` before it.
        """
        if self.owner is None:
            raise RuntimeError("no API client subscribed to the voice assistant")
        if self.state != State.IDLE:
            if interrupt is Interrupt.FIRMWARE:
                if (
                    self.state == State.STREAMING_RESPONSE
                    and self._play_task is not None
                ):
                    self._record.add(Kind.NOTE, what="wake word stopped the playback")
                    self._stop_playback()
                    self._send(api_pb2.VoiceAssistantAnnounceFinished(success=True))
                    self._response_finished()
                else:
                    self._record.add(Kind.NOTE, what="wake word ignored: busy")
                return None
            if interrupt is Interrupt.STOP_FIRST:
                self.signal_stop()
            self._stop_mic("new run")
            self._stop_playback()
            self._end_run("interrupted")
            self._set_state(State.IDLE)
        return self.start(
            wake_word_phrase=wake_word_phrase, conversation_id=conversation_id
        )

    def start(
        self,
        *,
        wake_word_phrase: str | None,
        conversation_id: str | None = None,
        continued: bool = False,
    ) -> Run:
        """Send the start request (``START_PIPELINE``) from idle; the mic starts capturing."""
        if self.owner is None:
            raise RuntimeError("no API client subscribed to the voice assistant")
        if self.state != State.IDLE:
            raise RuntimeError(f"voice assistant busy ({self.state})")
        if wake_word_phrase is not None:
            self.wake_word_phrase = wake_word_phrase
        if conversation_id is not None:
            self.conversation_id = conversation_id
        flags = 0
        if not continued and self._config.use_wake_word:
            flags |= USE_WAKE_WORD
        if self._config.silence_detection:
            flags |= USE_VAD
        self.continue_conversation = False
        self._tts_url = ""
        self._started_streaming_tts = False
        self._stream_end_seen = False
        run = Run(
            number=len(self.runs) + 1,
            wake_word_phrase=self.wake_word_phrase,
            conversation_id=self.conversation_id,
            flags=flags,
            requested_at=self._loop.time(),
            continued=continued,
        )
        self.runs.append(run)
        self._ring.clear()
        if self.speaker_path is not None:
            self.speaker_path.allocate()  # START_MICROPHONE: allocate + clear_buffers_
        self._mic_streaming = True
        self._hold_mic()
        self._set_state(State.STARTING_PIPELINE)
        self._mic_task = self._spawn(self._capture(run))
        self._send(
            api_pb2.VoiceAssistantRequest(
                start=True,
                conversation_id=self.conversation_id,
                flags=flags,
                audio_settings=api_pb2.VoiceAssistantAudioSettings(
                    noise_suppression_level=0, auto_gain=0, volume_multiplier=1.0
                ),
                wake_word_phrase=self.wake_word_phrase,
            )
        )
        return run

    def end_utterance(self) -> None:
        """Send ``VoiceAssistantAudio(end=True)`` and stop the mic."""
        if self.state == State.STREAMING_MICROPHONE:
            self._send(api_pb2.VoiceAssistantAudio(end=True))
            self._stop_mic("end of utterance")
            self._set_state(State.AWAITING_RESPONSE)

    def abort(self) -> None:
        """``request_stop`` of the firmware: stop locally and signal the client.

        With ``firmware_speaker`` as ``VoiceAssistant::request_stop`` has it for a
        ``speaker:``: AWAITING_RESPONSE only signals the stop (the state waits for an
        event, e.g. RUN_END), STREAMING_RESPONSE does nothing (the answer plays out).
        """
        self.continue_conversation = False
        if self.speaker_path is not None and self.state in (
            State.AWAITING_RESPONSE,
            State.STREAMING_RESPONSE,
        ):
            if self.state == State.AWAITING_RESPONSE:
                self.signal_stop()
            return
        if self.state in (State.STARTING_PIPELINE, State.STREAMING_MICROPHONE):
            self.signal_stop()
            self._stop_mic("aborted")
        elif self.state == State.AWAITING_RESPONSE:
            self.signal_stop()
        elif self.state == State.STREAMING_RESPONSE:
            if self._started_streaming_tts:
                self.signal_stop()
            self._stop_playback()
        self._set_state(State.IDLE)
        self._end_run("aborted")

    def press_button(self) -> None:
        """Press the button, as ``packages/voice.yaml`` ``on_button`` is written (no timer).

        ``end_run``: ``speaker.mute_on``, ``speaker.stop``, ``voice_assistant.stop``,
        wait until the voice assistant is idle, wait (<= 1 s) for the speaker to
        stop, ``speaker.mute_off``; then ``voice_assistant.start``.
        """
        self._spawn(self._on_button())

    async def _on_button(self) -> None:
        path = self.speaker_path
        self._record.add(Kind.NOTE, what="button")
        if self.state != State.IDLE:
            if path is not None:
                path.muted = True
                path.stop("speaker.stop")
            since = len(self._record)
            self.abort()
            if self.state != State.IDLE:
                await self._record.wait_for(
                    lambda e: e.kind is Kind.STATE and e.detail["state"] == State.IDLE,
                    since,
                )
        if path is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0 / self._config.speed):
                    await path.stopped.wait()
            path.muted = False
        if self.owner is not None and self.state == State.IDLE:
            self.start(wake_word_phrase=None)

    # -- mic -------------------------------------------------------------------

    async def _capture(self, run: Run) -> None:
        capacity = max(1, self._config.mic_buffer_ms // 32)
        async for frame in mic_clock(self.mic, self._config.speed, self._loop):
            if self.state == State.STARTING_PIPELINE:
                if len(self._ring) < capacity:
                    self._ring.append(frame)
                else:
                    run.frames_lost += 1
                    if run.frames_lost == 1:
                        self._record.add(Kind.NOTE, what="mic ring buffer full")
            elif self.state == State.STREAMING_MICROPHONE:
                self._send_frame(run, frame)
            else:
                return

    def _send_frame(self, run: Run, frame: Frame) -> None:
        message = api_pb2.VoiceAssistantAudio(data=frame.pcm)
        if self._config.second_channel and _HAS_DATA2:
            # raw: the unprocessed mic; echo: LVA's reference (not modelled: silence)
            message.data2 = (
                frame.pcm
                if self._config.second_channel == "raw"
                else bytes(len(frame.pcm))
            )
        self._send(message)
        run.frames_sent += 1
        if frame.speech:
            run.speech_frames_sent += 1
            run.last_speech_frame_at = self._loop.time()
        if frame.last_speech and self.end_after_speech:
            self.end_utterance()

    def _stop_mic(self, why: str) -> None:
        task, self._mic_task = self._mic_task, None
        if self._mic_streaming:
            self._mic_streaming = False
            self._maybe_release_mic()
        if task is None:
            return
        task.cancel()
        run = self.run
        if run is not None:
            run.mic_stopped_at = self._loop.time()
            run.mic_stop_reason = why
            self._record.add(Kind.MIC_STOP, frames=run.frames_sent, why=why)
        self._ring.clear()

    # -- messages from the owner ----------------------------------------------

    def on_response(self, message: api_pb2.VoiceAssistantResponse) -> None:
        """Client's answer to a start request."""
        run = self.run
        if self.state != State.STARTING_PIPELINE or run is None:
            self.signal_stop()
            return
        if message.error:
            run.failed = True
            self._stop_mic("failed to start")
            self._set_state(State.IDLE)
            self._end_run("failed to start")
            return
        if message.port:
            self._record.add(
                Kind.NOTE, what=f"UDP audio to port {message.port} is not emulated"
            )
        run.streaming_at = self._loop.time()
        run.streaming.set()
        self._set_state(State.STREAMING_MICROPHONE)
        self._record.add(Kind.MIC_START, buffered=len(self._ring))
        buffered, self._ring = self._ring, []
        for frame in buffered:
            if self.state != State.STREAMING_MICROPHONE:
                break
            self._send_frame(run, frame)

    def on_event(
        self, entry: Entry, message: api_pb2.VoiceAssistantEventResponse
    ) -> None:
        """React to a pipeline event as ``VoiceAssistant::on_event`` does."""
        data = {item.name: item.value for item in message.data}
        event = message.event_type
        if (run := self.run) is not None:
            run.events.append(entry)
        if event == EventType.RUN_START:
            self._started_streaming_tts = False
            self._tts_url = data.get("url", "")
            for automation in self.on_start:  # deferred start_trigger_.trigger()
                self._loop.call_soon(automation)
        elif event == EventType.STT_VAD_END or (
            event in self._config.mic_stop_events
            and self.state == State.STREAMING_MICROPHONE
        ):
            self._stop_mic(
                "stt_vad_end" if event == EventType.STT_VAD_END else f"event {event}"
            )
            self._set_state(State.AWAITING_RESPONSE)
            if self._config.half_duplex_scripts:  # before_reply: micro_wake_word.stop
                self.stop_wake_word()
        elif event == EventType.INTENT_PROGRESS:
            if (
                data.get("tts_start_streaming") == "1"
                and self._tts_url
                and self._config.uses_media_player
            ):
                self._stop_mic("tts_start_streaming")
                self._started_streaming_tts = True
                self._set_state(State.STREAMING_RESPONSE)
                self._play([("tts_streaming", self._tts_url)])
                self._tts_url = ""
        elif event == EventType.INTENT_END:
            if "conversation_id" in data:
                self.conversation_id = data["conversation_id"]
            if "continue_conversation" in data:
                self.continue_conversation = data["continue_conversation"] == "1"
        elif event == EventType.TTS_START:
            if self.speaker_path is not None and data.get("text"):
                self.speaker_path.start()  # deferred speaker_->start()
        elif event == EventType.TTS_END:
            self._on_tts_end(data)
        elif event == EventType.RUN_END:
            if self.state in (State.STARTING_PIPELINE, State.STREAMING_MICROPHONE):
                self._stop_mic("run_end")
                self._set_state(State.IDLE)
            elif self.state == State.AWAITING_RESPONSE:
                self._set_state(State.IDLE)
            if self.state == State.IDLE:
                self._end_run("run_end")
            if self._config.half_duplex_scripts:
                self._spawn(self._after_run())
        elif event == EventType.ERROR:
            self._on_error(data)
        elif event == EventType.TTS_STREAM_START:
            if not self._config.uses_media_player:
                self._stream_end_seen = False
                self._api_playback = Playback(
                    source="api", requested_at=self._loop.time(), format=PCM16K
                )
                self.playbacks.append(self._api_playback)
        elif event == EventType.TTS_STREAM_END:
            if not self._config.uses_media_player:
                self._stream_end_seen = True
                if self.speaker_path is None:
                    self._play_api_out()

    async def _after_run(self) -> None:
        """``after_run`` (half duplex): wait until the speaker stopped, then the wake word."""
        path = self.speaker_path
        if path is not None:
            await path.stopped.wait()
        if self.owner is not None:
            self.start_wake_word()

    def _on_tts_end(self, data: dict[str, str]) -> None:
        url = data.get("url", "")
        if not url:
            return
        self._stop_mic("tts_end")
        if self._config.uses_media_player and not self._started_streaming_tts:
            self._play([("tts_end", url)])
        self._started_streaming_tts = False
        self._set_state(State.STREAMING_RESPONSE)
        if self.speaker_path is not None and self._response_task is None:
            self._response_task = self._spawn(self._stream_response(self.speaker_path))

    async def _stream_response(self, path: SpeakerPath) -> None:
        """``loop`` STREAMING_RESPONSE then RESPONSE_FINISHED, for a ``speaker:``."""
        tick = LOOP_S / self._config.speed
        try:
            while self.state == State.STREAMING_RESPONSE:
                if path.received_bytes > 4 * 1024 or self._stream_end_seen:
                    path.write()
                if self._stream_end_seen:
                    break  # wait_for_stream_end_ and end_of_stream: RESPONSE_FINISHED
                await asyncio.sleep(tick)
            else:
                return
            while path.buffer:  # RESPONSE_FINISHED: the buffer, then the speaker
                path.write()
                await asyncio.sleep(tick)
            await (
                path.stopped.wait()
            )  # has_buffered_data() || is_running(): the idle stop
            path.clear()
            playback = self._api_playback
            if playback is not None and playback.finished_at is None:
                playback.finished_at = self._loop.time()
                self._record.add(Kind.PLAYBACK, playback=playback)
        finally:
            self._response_task = None
        self._response_finished()

    def _on_error(self, data: dict[str, str]) -> None:
        code = data.get("code", "")
        if code in IGNORED_ERRORS:
            return
        if code in STOPPING_ERRORS:
            self.abort()
            return
        if self.state != State.IDLE:
            self.signal_stop()
            self._stop_mic("error")
            self._set_state(State.IDLE)
        self._end_run(f"error {code}")

    def on_audio(self, message: api_pb2.VoiceAssistantAudio) -> None:
        """Raw API speaker audio from the client."""
        now = self._loop.time()
        self._record.add(
            Kind.SPEAKER_AUDIO,
            bytes=len(message.data),
            end=message.end,
            silent=not any(message.data),  # the link's keepalive and tail frames
        )
        playback = self._api_playback
        if playback is None or playback.finished_at is not None or playback.stopped:
            playback = Playback(
                source="api",
                requested_at=now,
                format=PCM16K,
                audible=self._config.plays_api_audio,
            )
            self._api_playback = playback
            self.playbacks.append(playback)
        if message.data and self.speaker_path is not None:
            self.speaker_path.feed(message.data)
        if message.data:
            if self._config.echo_gain > 0 and playback.audible:
                self.mic.echo(
                    message.data,
                    gain=self._config.echo_gain,
                    delay_ms=self._config.echo_delay_ms,
                )
            if playback.first_byte_at is None:
                playback.first_byte_at = now
            playback.last_byte_at = now
            playback.bytes += len(message.data)
            playback.data.extend(message.data)

    def stop_speaker(self) -> None:
        """``speaker.stop`` on the voice assistant's speaker (an action, ``actions.py``).

        ``i2s_audio_speaker.cpp``: the speaker task ends and frees its ring buffer,
        so raw API audio received so far is not heard past this moment (with the
        firmware's speaker path: ``SpeakerPath.stop``, ``STOP_S`` later); what waits
        in the voice assistant's buffer stays there (``speaker.stop`` does not touch
        it) and plays when the next message starts the speaker again; audio that
        comes later starts the speaker again (a new ``Playback``).
        """
        if self.speaker_path is not None:
            self.speaker_path.stop("speaker.stop")
        playback = self._api_playback
        if playback is None or playback.finished_at is not None or playback.stopped:
            return
        playback.stopped = True
        playback.stopped_at = self._loop.time()
        self._record.add(Kind.NOTE, what="speaker stopped", bytes=playback.bytes)

    def on_announce(self, message: api_pb2.VoiceAssistantAnnounceRequest) -> None:
        """Play an announcement; maybe listen afterwards (``start_conversation``)."""
        if not self._config.uses_media_player:
            self._record.add(Kind.NOTE, what="announce ignored: no media player")
            return
        self._stop_mic("announce")
        items = []
        if message.preannounce_media_id:
            items.append(("preannounce", message.preannounce_media_id))
        items.append(("announce", message.media_id))
        self.continue_conversation = message.start_conversation
        self._set_state(State.STREAMING_RESPONSE)
        self._play(items)

    def on_timer(self, message: api_pb2.VoiceAssistantTimerEventResponse) -> None:
        """Keep the timer table as the firmware does."""
        self._record.add(Kind.TIMER, timer=message)
        if message.event_type in (2, 3):  # cancelled, finished
            self.timers.pop(message.timer_id, None)
        else:
            self.timers[message.timer_id] = message

    def configuration(
        self, client: Client
    ) -> api_pb2.VoiceAssistantConfigurationResponse:
        """Wake word configuration (empty for a client that does not own the assistant)."""
        response = api_pb2.VoiceAssistantConfigurationResponse()
        if client is not self.owner:
            return response
        for wake_word in self._config.wake_words:
            response.available_wake_words.append(
                api_pb2.VoiceAssistantWakeWord(
                    id=wake_word.id,
                    wake_word=wake_word.wake_word,
                    trained_languages=list(wake_word.trained_languages),
                )
            )
        response.active_wake_words.extend(self.active_wake_words)
        response.max_active_wake_words = self._config.max_active_wake_words
        return response

    def set_configuration(
        self, message: api_pb2.VoiceAssistantSetConfiguration
    ) -> None:
        """Enable exactly the known wake words listed."""
        known = {wake_word.id for wake_word in self._config.wake_words}
        self.active_wake_words = [ww for ww in message.active_wake_words if ww in known]

    # -- playback --------------------------------------------------------------

    def play_media(self, url: str) -> None:
        """Play a URL (a media player command)."""
        self._play([("media_player", url)], finish=False)

    def stop_media(self) -> None:
        """Stop playing (a media player STOP command)."""
        self._stop_playback()

    def _play(self, items: list[tuple[str, str]], *, finish: bool = True) -> None:
        self._stop_playback()
        self._play_task = self._spawn(self._play_items(items, finish))

    async def _play_items(self, items: list[tuple[str, str]], finish: bool) -> None:
        speaker = self._speaker()
        self._on_media_state(True)
        ok = True
        try:
            for source, url in items:
                playback = Playback(source=source, url=url)
                self.playbacks.append(playback)
                try:
                    await speaker.play_url(playback)
                except asyncio.CancelledError:
                    self._record.add(Kind.PLAYBACK, playback=playback)  # stopped
                    raise
                self._record.add(Kind.PLAYBACK, playback=playback)
                ok = ok and playback.error is None
        finally:
            self._on_media_state(False)
        if finish:
            self._send(api_pb2.VoiceAssistantAnnounceFinished(success=ok))
            self._response_finished()

    def _play_api_out(self) -> None:
        playback = self._api_playback
        if playback is None:
            self._response_finished()
            return

        async def play_out() -> None:
            await self._speaker().play_out(playback)
            self._record.add(Kind.PLAYBACK, playback=playback)
            self._response_finished()

        self._play_task = self._spawn(play_out())

    def _stop_playback(self) -> None:
        response, self._response_task = self._response_task, None
        if response is not None and not response.done():
            response.cancel()
        task, self._play_task = self._play_task, None
        if task is not None and not task.done():
            task.cancel()
        if self._api_playback is not None and self._api_playback.finished_at is None:
            self._api_playback.stopped = True
        self._api_playback = None

    def _response_finished(self) -> None:
        self._play_task = None
        if self.state != State.STREAMING_RESPONSE:
            return
        self._set_state(State.IDLE)
        self._end_run("response finished")
        if self.continue_conversation and self.owner is not None:
            self.start(wake_word_phrase=None, continued=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self.errors.append(error)
            _LOGGER.error("emulator task failed", exc_info=error)
            self._record.add(Kind.NOTE, what=f"task failed: {error!r}")

    async def aclose(self) -> None:
        """Cancel the mic and speaker tasks and wait for them."""
        self._mic_task = self._play_task = self._response_task = None
        if self._release is not None:
            self._release.cancel()
        if self.speaker_path is not None:
            self.speaker_path.close()
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)  # done callbacks may not have run yet
