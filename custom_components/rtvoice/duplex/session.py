"""The duplex session: one open mic, one answer playing, barge-in by voice.

Mic frames go (optionally) through the echo canceller, then the onset gate and the
utterance segmenter. An utterance is transcribed; words are pushed into the kernel
child (cancelling the round: latest wins). The kernel's output deltas are split into
sentences, synthesised and played at real-time pace; what was played is acknowledged
back as characters of the round's text.

States (``SessionState``):

- ``LISTENING``: no answer audio is playing (the answer may be thinking).
- ``SPEAKING``: answer audio is playing.
- ``PAUSED``: the gate heard a possible speech onset while speaking (``vad`` mode):
  playback is paused, not cut, until the utterance is judged. Words → the answer is
  cut at what was heard (acknowledged, final) and the words are pushed. No words (a
  cough, a door) or no speech found within ``confirm_ms`` → resume.
- ``RESUMING``: playing again after a false barge-in; the gate must go quiet before it
  may pause again (one noise, one pause).
- ``ENDED``: closed, or silent for ``end_silence_ms`` after the last answer.

In ``wake_word`` mode speech never pauses an answer; ``wake_word_detected()`` cuts it.
In ``off`` mode nothing interrupts while speaking (utterances that start then are
dropped). The answer's echo outlives it by the room's delay and reverberation, and
the VAD often runs that tail and the user's next words into one utterance: one that
started over the answer but is still loud ``ECHO_TAIL_MS`` after the answer ended
is kept from the quietest moment of that tail on, and transcribed like any other.
Silence is counted in mic audio, so no timer task exists.

A room with a loud sound of its own (a TV, a radio): the onset gate learns how
loud it gets while answers play (``gate.RoomLevel``, kept by the satellite across
conversations) and opens only on sound well over it; an utterance that the VAD
alone heard, never that loud, is the room talking and is dropped
(``room_utterances``), in any state.

End of turn by what was said (``DuplexOptions.eagerness``, issue 18): at a short
silence inside an utterance (``UtterancePaused``) the words so far are transcribed
(a second STT stream) and judged (``turn.judge_turn``, with ``recognise``: HA's
intent matching). ``END`` and ``HOLD`` push the words *speculatively*, at most once
per utterance (the kernel answers but calls no tool, and commits nothing until the
user hears the answer), and the utterance goes on: the segmenter's hangover still
ends it. ``END``: the answer plays as soon as it comes. ``HOLD``: only its first
sentence is synthesised ahead; it plays once confirmed. Either is *revocable* until
its answer's first frame goes out to the satellite: speech again before that (a
gate onset) withdraws it (``preempted``: nothing played, nothing kept), and the
whole utterance is transcribed and pushed as usual. The hangover, with no speech
since the pause, *confirms* it (no second STT): a tool call waits for that, so no
device acts on words the silence alone would not have ended the turn with. Speech
after an END's answer was heard is a barge-in like any other (``vad`` mode): the
whole utterance is transcribed, and its words are pushed unless they are the same
(then the answer is confirmed and resumes). Where the user's voice cannot
interrupt an answer (``wake_word``/``off`` mode, or a mic that hears itself) the
turn is over once its answer is heard: confirmed, the segmenter restarted.
``WAIT`` (unfinished words): nothing until the hangover.

The DSP of each 10 ms frame (echo canceller, gate, VAD: ``_analyse``) runs on the
stream's ``DspWorker`` when one is given, and only there; its results come back in
order and the state machine above acts on them on the loop (``_apply``). Whatever
the state machine reads of the DSP (gate open, in an utterance) is the copy of the
last applied frame; restarting the segmenter is a job on the worker too, and results
of audio submitted before it are stale (their utterance events are dropped).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
import contextlib
from dataclasses import dataclass, field
import enum
from functools import partial
import logging
from typing import Any

from .audio import BYTES_PER_MS, FRAME_BYTES, FRAME_MS, FrameChunker, frame_dbfs
from .clock import Clock
from .contracts import (
    BargeIn,
    ConversationChild,
    DuplexOptions,
    Recogniser,
    SendFrame,
    SpeechToText,
    TextToSpeech,
)
from .echo import EchoCanceller, MicTimeline
from .gate import EchoAwareGate, GateEvent, OnsetGate, RoomLevel
from .heard import HeardLedger
from .player import PacedPlayer, PlayerState
from .segmenter import (
    SegmentEvent,
    UtteranceEnded,
    UtterancePaused,
    UtteranceSegmenter,
    UtteranceStarted,
)
from .self_hearing import SelfHearing
from .sentences import Sentence, SentenceSplitter
from .turn import Eagerness, TurnVerdict, judge_turn, same_words, unfinished
from .worker import DspWorker

_LOGGER = logging.getLogger(__name__)

# How long the echo of an answer may go on after its last frame played: the delay
# of the echo path plus its reverberant tail (tests/duplex/echo_sim.py: up to
# 400 ms + 200 ms). Sound after that, in an utterance that began over the answer,
# is the user's (wake_word and off modes).
ECHO_TAIL_MS = 600
_LOUD_DBFS = -50.0  # as the onset gate: quieter is no speech
_LOUD_OVER_DB = 12.0
# Utterances waiting for the STT: a person says at most a few before the first
# is transcribed; more means audio faster than real time (drop the oldest).
MAX_PENDING_UTTERANCES = 5


class SessionState(enum.StrEnum):
    """Where the session is (see the module docstring)."""

    LISTENING = "listening"
    SPEAKING = "speaking"
    PAUSED = "paused"
    RESUMING = "resuming"
    ENDED = "ended"


@dataclass
class SessionStats:
    """Counters of one session (diagnostics and benchmarks)."""

    utterances: int = 0
    pushes: int = 0  # words pushed into the child (early pushes included)
    barge_ins: int = 0  # answers cut by the user's words
    pauses: int = 0  # onset pauses
    false_barge_ins: int = 0  # pauses that resumed
    wake_interrupts: int = 0
    dropped_utterances: int = 0  # spoken while speaking in wake_word/off mode
    tail_utterances: int = 0  # began in an answer's echo tail, kept from its end
    echo_utterances: int = 0  # VAD-only utterances over an answer, no energy: dropped
    room_utterances: int = (
        0  # VAD-only, never louder than the room's own sound: dropped
    )
    stt_errors: int = 0
    stt_dropped: int = 0  # utterances dropped unheard: more than the STT could take
    tts_errors: int = 0
    last_pause_mic_ms: int | None = None  # mic position of the last pause
    last_onset_mic_ms: int | None = None  # where the gate put that onset
    pause_mic_ms: list[int] = field(default_factory=list)  # mic positions of pauses
    pause_gaps_ms: list[int] = field(
        default_factory=list
    )  # pause -> resume, false barge-ins
    # End of turn by what was said (issue 18):
    early_transcripts: int = 0  # short silences transcribed (second STT stream)
    # Early pushes, at most one per utterance: END (played at once) or HOLD.
    early_ends: int = 0  # END: the turn ended at the short silence (revocably)
    speculations: int = 0  # HOLD: answered ahead, held until confirmed
    confirmed_speculations: int = 0  # early pushes confirmed (hangover, or heard)
    preempted: int = 0  # withdrawn before their answer went out: the user went on
    spoken_over_ends: int = 0  # END answers heard, then new words: a cut-off
    hears_itself: bool = False  # vad without echo cancellation, the mic hears answers


@dataclass(slots=True)
class _Early:
    """A short silence being judged: the words so far and what came of them."""

    stt: asyncio.Task[str]  # the transcript of the utterance up to the silence
    resumed: bool = False  # the user went on speaking after it
    text: str = ""
    ticket: Any = None  # the early push (TicketLike), if END or HOLD
    held: bool = False  # HOLD: its answer plays only once confirmed
    heard: bool = False  # its answer's first frame went out: no longer revocable


@dataclass(slots=True)
class _Track:
    """The utterance the segmenter is in: whether it counts, and why not."""

    ignored: bool = False  # started over an answer in wake_word/off mode
    answer_ended_ms: int | None = None  # mic position where that answer ended
    over_answer: bool = False  # started while an answer was playing or paused
    energy: bool = False  # the onset gate was open at some point during it
    early: _Early | None = None  # its latest short silence being judged
    speculated: bool = False  # one early push (speculative round) per utterance
    room_loud: bool = False  # the room had a loud sound of its own (a TV) during it


@dataclass(frozen=True, slots=True)
class _FrameResult:
    """What the DSP found in one 10 ms mic frame (computed on the DSP worker)."""

    gate_event: GateEvent | None
    onset_frame: int
    gate_open: bool
    segment_event: SegmentEvent | None
    in_utterance: bool
    level: float  # the frame's level (dBFS) at the gate
    room_loud: bool  # the room's own sound is loud (a TV): the gate judges over it


@dataclass
class _Utterance:
    """An utterance on its way to the STT."""

    pcm: bytes
    barge_in: bool  # started while an answer was paused for it
    words: asyncio.Task[str] | None = None  # already transcribed at its last pause
    early: _Early | None = None  # its early push, heard and then spoken over


class _Answer:
    """The output of one round: its sentences, their audio, what was heard."""

    def __init__(self, seq: int, early_chars: int, *, held: bool = False) -> None:
        self.seq = seq
        # A speculative round's answer: synthesised ahead, played once confirmed.
        self.hold: asyncio.Event | None = asyncio.Event() if held else None
        self.splitter = SentenceSplitter(early_min_chars=early_chars)
        self.ledger = HeardLedger(seq)
        self.sentences: asyncio.Queue[Sentence | None] = asyncio.Queue()
        self.text_ended = False
        self.text_paused = False  # the text waits for tool calls
        self.task: asyncio.Task[None] | None = None
        self.acked = 0
        self.synthesised = False  # a sentence went to the TTS


class DuplexSession:
    """One conversation over one open mic. Not thread-safe: call it from the loop."""

    def __init__(
        self,
        child: ConversationChild,
        *,
        stt: SpeechToText,
        tts: TextToSpeech,
        send: SendFrame,
        options: DuplexOptions | None = None,
        segmenter: UtteranceSegmenter | None = None,
        gate: OnsetGate | None = None,
        room: RoomLevel | None = None,
        echo: EchoCanceller | None = None,
        echo_gate: bool = False,
        clock: Clock | None = None,
        on_end: Callable[[], None] | None = None,
        on_state: Callable[[SessionState], None] | None = None,
        on_hears_itself: Callable[[], None] | None = None,
        hears_itself: bool = False,
        dsp: DspWorker | None = None,
        first_seq: int = 0,
        recognise: Recogniser | None = None,
    ) -> None:
        """Bind the child, STT, TTS and transport; ``segmenter`` default: a warmed VAD (blocking).

        ``dsp``: the stream's worker that runs the mic DSP (echo canceller, gate,
        VAD) off the loop; None runs it inline in ``feed_mic`` (tests, benches).
        ``room``: how loud the satellite's room gets by itself (a TV), learnt
        while answers play and kept across its conversations; None: this
        session's own.
        The session does not own it. Rounds up to ``first_seq`` are not its own (an
        earlier session of the same child): their output is ignored.
        ``recognise(text)``: whether the words are a whole command (HA's intent
        matching), for ``options.eagerness``. ``on_hears_itself()``: called once
        when, in ``vad`` mode without echo cancellation, the mic turns out to hear
        the answers (see self_hearing.py); from then on only the wake word or the
        button interrupts the conversation's answers. ``hears_itself``: known
        already (an earlier conversation of the satellite found it).
        """
        self.options = options if options is not None else DuplexOptions()
        self._child = child
        self._stt = stt
        self._tts = tts
        self._send = send
        self._echo = echo
        self._on_end = on_end
        self._on_state = on_state
        self._on_hears_itself = on_hears_itself
        self._self_hearing = (
            SelfHearing()
            if echo is None and self.options.barge_in is BargeIn.VAD
            else None
        )
        self.segmenter = segmenter if segmenter is not None else UtteranceSegmenter()
        self._recognise = recognise
        self._eagerness = self.options.eagerness
        # Set before any audio reaches the worker (the DSP reads it there).
        self.segmenter.pause_frames = (
            self.options.turn_pause_ms // FRAME_MS if self._eagerness else 0
        )
        # The early push not yet confirmed or withdrawn (END or HOLD).
        self._early: _Early | None = None
        self.gate = gate if gate is not None else OnsetGate(room=room)
        # Opt-in second gate on the raw mic (beats AEC3's double-talk hold when the
        # user is louder than the echo, at the price of more false pauses: see
        # scripts/bench_duplex.py).
        self._echo_gate = EchoAwareGate() if echo is not None and echo_gate else None
        self.player = PacedPlayer(
            self._send_frame,
            clock=clock,
            frame_ms=self.options.frame_ms,
            lead_ms=self.options.lead_ms,
        )
        self.state = SessionState.LISTENING
        self.stats = SessionStats(hears_itself=hears_itself)
        self._chunker = FrameChunker(FRAME_BYTES)
        self._reference_chunker = FrameChunker(FRAME_BYTES)  # the device's own
        self._timeline = MicTimeline()
        self.mic_ms = 0
        self._answer: _Answer | None = None
        self._last_closed_seq = first_seq
        self._dsp = dsp
        self._epoch = 0  # bumped when the segmenter restarts: older results are stale
        self._gate_open = False  # the last applied frame's view (the loop's copy)
        self._in_utterance = False
        self._pending_rounds: set[int] = set()
        self._utterances: asyncio.Queue[_Utterance] = asyncio.Queue()
        self._transcribing = False
        self._utterance = _Track()
        self._paused_at_ms = 0
        self._silent_ms = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._stt_task: asyncio.Task[None] | None = None

    @property
    def idle(self) -> bool:
        """True when no utterance, transcription, round or answer is in progress."""
        return (
            self._answer is None
            and not self._pending_rounds
            and not self._in_utterance
            and not self._stt_pending()
            and not any(
                t.get_name() == "rtvoice duplex end of turn" for t in self._tasks
            )
        )

    # --- inputs ----------------------------------------------------------------------

    def feed_mic(self, pcm: bytes, reference: bytes | None = None) -> None:
        """Process mic audio (16 kHz mono s16le, any chunk size).

        ``reference``: the device's own echo reference for the same samples (the
        second channel of ``MULTI_CHANNEL_AUDIO``: what its speaker played,
        sample-aligned), used as the echo canceller's far end instead of the
        time line. With a ``dsp`` worker the DSP runs there and its results are
        applied on the loop in order; without one it runs here (blocking).
        """
        if self.state is SessionState.ENDED:
            return
        if self._echo is not None:
            self._timeline.chunk(self.player.clock.now(), len(pcm) // 2)
        frames = self._chunker.feed(pcm)
        references: list[bytes | None] | None = None
        if self._echo is not None and reference and len(reference) == len(pcm):
            references = list(self._reference_chunker.feed(reference))
        elif self._echo is not None:
            self._reference_chunker.feed(bytes(len(pcm)))  # stays in step
        if not frames:
            return
        epoch = self._epoch
        job = partial(self._analyse, references=references)
        if self._dsp is None:
            self._apply(epoch, job(frames))
        elif not self._dsp.submit(
            job, frames, done=partial(self._apply, epoch), droppable=True
        ):
            _LOGGER.debug("Mic audio after the DSP worker closed: dropped")

    def output_delta(self, seq: int, text: str) -> None:
        """Take a text delta of round ``seq`` (from the kernel's output handler)."""
        if self.state is SessionState.ENDED or seq <= self._last_closed_seq:
            return
        answer = self._answer
        if answer is not None and seq < answer.seq:
            return
        if answer is None or answer.seq != seq:
            if answer is not None:
                self._cut_answer()  # a newer round supersedes what plays
            answer = self._open_answer(seq)
        self._silent_ms = 0
        answer.text_paused = False
        for sentence in answer.splitter.feed(text):
            answer.sentences.put_nowait(sentence)

    def output_pause(self, seq: int) -> None:
        """Round ``seq``'s text waits for its tool calls: speak what is held back.

        The splitter judges a sentence's end only once the next character arrives;
        while a tool runs none arrives, so the preamble the model said before it
        ("Let me check the heating.") would stay silent until the tool returns.
        """
        answer = self._answer
        if self.state is SessionState.ENDED or answer is None or answer.seq != seq:
            return
        if answer.text_ended:
            return
        answer.text_paused = True
        for sentence in answer.splitter.flush():
            answer.sentences.put_nowait(sentence)

    def output_end(self, seq: int) -> None:
        """Round ``seq`` will emit no more text (completed, cut or failed)."""
        self._pending_rounds.discard(seq)
        if self.state is SessionState.ENDED or seq <= self._last_closed_seq:
            return
        answer = self._answer
        if answer is None or answer.seq != seq:
            if answer is not None and answer.seq < seq:
                self._cut_answer()
            # Nothing was said in this round: nothing was heard.
            self._last_closed_seq = max(self._last_closed_seq, seq)
            self._child.acknowledge(seq, 0, final=True)
            return
        if not answer.text_ended:
            answer.text_ended = True
            for sentence in answer.splitter.flush():
                answer.sentences.put_nowait(sentence)
            answer.sentences.put_nowait(None)

    def wake_word_detected(self) -> None:
        """Interrupt the answer: the wake word was heard; what follows is a new utterance."""
        if self.state is SessionState.ENDED:
            return
        self._silent_ms = 0
        if self._answer is not None or self._pending_rounds:
            self.stats.wake_interrupts += 1
            self._cut_answer()
            self._child.interrupt()
        self._early = None  # interrupted with the round
        self._restart_segmenter()
        self._utterance = _Track()
        self._set_state(SessionState.LISTENING)

    def end(self) -> None:
        """End the session now (the device went away or aborted), not by silence.

        The answer is cut at what was heard (acknowledged) and the running round is
        interrupted; ``on_end`` is not called. ``aclose`` still releases the tasks.
        """
        if self.state is SessionState.ENDED:
            return
        if self._answer is not None or self._pending_rounds:
            self._cut_answer()
            self._child.interrupt()
        self._early = None
        self._set_state(SessionState.ENDED)

    async def aclose(self) -> None:
        """End the session; no task is left running."""
        self.state = SessionState.ENDED
        tasks = list(self._tasks)
        if self._stt_task is not None:
            tasks.append(self._stt_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._stt_task = None
        self._answer = None
        await self.player.aclose()

    # --- mic path ----------------------------------------------------------------------

    def _restart_segmenter(self) -> None:
        """Restart the segmenter in order with the audio already submitted."""
        self._epoch += 1
        self._in_utterance = False
        if self._dsp is None:
            self.segmenter.restart()
        else:
            self._dsp.submit(self.segmenter.restart)

    def _analyse(
        self, frames: list[bytes], references: list[bytes | None] | None = None
    ) -> list[_FrameResult]:
        """Run the DSP over 10 ms frames (on the worker: touches no session state)."""
        if self.state is SessionState.ENDED:
            return []
        if references is None or len(references) != len(frames):
            return [self._analyse_frame(frame) for frame in frames]
        return [
            self._analyse_frame(frame, reference)
            for frame, reference in zip(frames, references, strict=True)
        ]

    def _analyse_frame(
        self, frame: bytes, reference: bytes | None = None
    ) -> _FrameResult:
        raw = frame
        if self._echo is not None:
            frame = self._echo.process(frame, reference)
        # The answer plays and no pause waits for words: the user is quiet, what
        # the gate hears now is the room's own sound (and the answer's residual).
        learn_room = self.state in (SessionState.SPEAKING, SessionState.RESUMING)
        gate_event = self.gate.process(frame, learn_room=learn_room)
        if self._echo_gate is not None and self._echo is not None:
            quiet = self.gate.level < self.gate.floor + self.gate.margin_db / 2
            raw_event = self._echo_gate.process(
                raw, self._echo.last_reference, learn=quiet
            )
            if (
                raw_event is GateEvent.ONSET
                and gate_event is None
                and not self.gate.open
            ):
                gate_event = raw_event
                onset_frame = self._echo_gate.onset_frame
            else:
                onset_frame = self.gate.onset_frame
        else:
            onset_frame = self.gate.onset_frame
        gate = self.gate
        gate_quiet = gate.level < max(gate.floor + gate.margin_db, gate.min_dbfs)
        segment_event = self.segmenter.process_frame(frame, quiet=gate_quiet)
        gate_open = self.gate.open
        if self._echo is not None and self._echo.learning:
            # A fresh canceller still learning the echo path: what opens the gate
            # now is the answer's own echo, not the user (no pause on it, and the
            # gate starts closed once the canceller has learnt).
            gate_event, gate_open = None, False
            self.gate.open = False
        return _FrameResult(
            gate_event,
            onset_frame,
            gate_open,
            segment_event,
            self.segmenter.in_utterance,
            self.gate.level,
            self.gate.room_loud,
        )

    def _apply(self, epoch: int, results: list[_FrameResult]) -> None:
        """Apply DSP results on the loop, frame by frame, until the session ends."""
        for result in results:
            if self.state is SessionState.ENDED:
                return
            self._process_frame(result, stale=epoch != self._epoch)

    def _process_frame(self, result: _FrameResult, *, stale: bool) -> None:
        """Act on one 10 ms frame's DSP result (``stale``: before a restart)."""
        self.mic_ms += FRAME_MS
        gate_event = result.gate_event
        onset_frame = result.onset_frame
        segment_event = None if stale else result.segment_event
        self._gate_open = result.gate_open
        if not stale:
            self._in_utterance = result.in_utterance
        if self._self_hearing is not None:
            epoch = self._epoch
            self._check_self_hearing(result.level)
            if self._epoch != epoch:  # the segmenter restarted: its event is stale
                segment_event = None
        vad_mode = self._voice_barge_in
        if self._gate_open or gate_event is GateEvent.ONSET:
            self._utterance.energy = True
        if result.room_loud:
            self._utterance.room_loud = True

        if (
            gate_event is GateEvent.ONSET
            and vad_mode
            and self.state is SessionState.SPEAKING
        ):
            self._pause(onset_frame)
        elif gate_event is GateEvent.QUIET and self.state is SessionState.RESUMING:
            self._set_state(SessionState.SPEAKING)

        early = self._utterance.early
        if gate_event is GateEvent.ONSET and early is not None and not early.resumed:
            self._speech_resumed(early)

        if isinstance(segment_event, UtteranceStarted):
            self._utterance_started()
        elif isinstance(segment_event, UtteranceEnded):
            self._utterance_ended(segment_event)
        elif isinstance(segment_event, UtterancePaused):
            self._utterance_paused(segment_event)

        if self.state is SessionState.PAUSED and self._no_speech_confirmed():
            self._resume()  # the VAD found no speech: a false onset
        self._count_silence()

    @property
    def _voice_barge_in(self) -> bool:
        """Whether the user's voice may interrupt an answer (``vad``, not deaf to it)."""
        return self.options.barge_in is BargeIn.VAD and not self.stats.hears_itself

    def _check_self_hearing(self, level: float) -> None:
        assert self._self_hearing is not None
        if self.stats.hears_itself or not self._self_hearing.mic(level):
            return
        self.stats.hears_itself = True
        if self._utterance.over_answer:
            self._utterance.ignored = True  # what it hears now is the answer
        if self._early is not None and self._early.heard:
            self._turn_over(self._early)  # what the utterance hears now is the answer
        if self.state is SessionState.PAUSED:
            self._resume()
        _LOGGER.warning(
            "The satellite's microphone hears its own answers (echo cancellation is"
            " off): barge-in by voice is off for this conversation; the wake word"
            " or the button interrupts"
        )
        if self._on_hears_itself is not None:
            self._on_hears_itself()

    def _no_speech_confirmed(self) -> bool:
        """Return True when the VAD has had its chance to find speech, and has not."""
        if self._in_utterance or self._stt_pending():
            return False
        paused_for = self.mic_ms - self._paused_at_ms
        if paused_for < self.options.confirm_ms:
            return False
        return not self._gate_open or paused_for >= self.options.max_pause_ms

    def _utterance_started(self) -> None:
        self._silent_ms = 0
        playing = self.state in (
            SessionState.SPEAKING,
            SessionState.RESUMING,
            SessionState.PAUSED,
        )
        self._utterance = _Track(
            ignored=playing and not self._voice_barge_in,
            over_answer=playing,
            energy=self._gate_open,
        )
        if self._utterance.ignored:
            return  # speech alone never interrupts in wake_word/off mode
        if self._utterance.energy and self.state in (
            SessionState.SPEAKING,
            SessionState.RESUMING,
        ):
            self._pause(None)  # the gate opened and the VAD agrees: speech

    def _utterance_ended(self, event: UtteranceEnded) -> None:
        track, self._utterance = self._utterance, _Track()
        pcm = event.pcm
        if track.ignored:
            after_tail = self._after_echo_tail(track, pcm)
            if after_tail is None:
                self.stats.dropped_utterances += 1
                return
            # Begun in the answer's echo tail, the user's words after it.
            self.stats.tail_utterances += 1
            pcm, track = after_tail, _Track(energy=True)
        if track.over_answer and not track.energy:
            # The VAD alone, over the answer, with no energy above the floor: what
            # it hears is residual echo (pymicro-vad fires on it); no words here.
            self.stats.echo_utterances += 1
            if self.state is SessionState.PAUSED and not self._stt_pending():
                self._resume()
            return
        if track.room_loud and not track.energy:
            # The VAD alone, never as loud as the user near the satellite over the
            # room's own sound: a TV or a radio talking, not the user.
            self.stats.room_utterances += 1
            return
        self.stats.utterances += 1
        early = track.early
        words = None
        if early is not None and not early.resumed:
            if early is self._early:
                self._confirm(early)  # the hangover confirms the early push
                return
            words = early.stt  # nothing said since the pause: its words are these
        if self._utterances.qsize() >= MAX_PENDING_UTTERANCES:
            # Audio faster than the STT (a device flooding its mic): the oldest
            # waiting utterance goes, so the queue and the latency stay bounded.
            self._utterances.get_nowait()
            self.stats.stt_dropped += 1
        # An early push still open here was heard, then spoken over: the words of
        # the whole utterance decide (_transcribed).
        self._utterances.put_nowait(
            _Utterance(pcm, track.over_answer, words, self._early)
        )
        self._start_stt_loop()

    def _start_stt_loop(self) -> None:
        if self._stt_task is None:
            self._stt_task = asyncio.get_running_loop().create_task(
                self._transcribe_loop(), name="rtvoice duplex stt"
            )

    def _after_echo_tail(self, track: _Track, pcm: bytes) -> bytes | None:
        """Return the part of an ignored utterance after the answer's echo, if loud.

        The utterance ends at the frame just applied (``mic_ms``). Where the
        answer ended, the echo may go on for ``ECHO_TAIL_MS``; when the utterance is
        loud after that, it is kept from the quietest frame of the tail on (where
        the echo had died down, or the user began), else there is nothing to keep.
        """
        if track.answer_ended_ms is None:
            return None
        frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
        ended = len(frames) - (self.mic_ms - track.answer_ended_ms) // FRAME_MS
        tail_end = max(0, ended) + ECHO_TAIL_MS // FRAME_MS
        if ended < 0 or tail_end >= len(frames):
            return None
        tail = [frame_dbfs(frame) for frame in frames[ended:tail_end]]
        quietest = min(range(len(tail)), key=tail.__getitem__)
        loud = max(_LOUD_DBFS, tail[quietest] + _LOUD_OVER_DB)
        loud_frames = 0
        for frame in frames[tail_end:]:  # stops at the third loud frame
            loud_frames += frame_dbfs(frame) >= loud
            if loud_frames == 3:
                return b"".join(frames[ended + quietest :])
        return None  # the tail and the VAD's hangover: no words after it

    # --- end of turn by what was said (issue 18) -----------------------------------

    def _utterance_paused(self, event: UtterancePaused) -> None:
        """Transcribe the words up to a short silence and judge them."""
        track = self._utterance
        if self._eagerness is None or track.ignored or not track.energy:
            return
        if track.early is not None and not track.early.resumed:
            return  # still judging the previous silence
        self.stats.early_transcripts += 1
        loop = asyncio.get_running_loop()
        stt = loop.create_task(
            self._transcribe_words(event.pcm), name="rtvoice duplex early stt"
        )
        self._keep(stt)
        early = _Early(stt)
        track.early = early
        self._keep(
            loop.create_task(
                self._judge(track, early), name="rtvoice duplex end of turn"
            )
        )

    async def _transcribe_words(self, pcm: bytes) -> str:
        async with asyncio.timeout(self.options.stt_timeout_s):
            return (await self._stt(pcm)).strip()

    async def _judge(self, track: _Track, early: _Early) -> None:
        """End the turn, speculate or wait, by what the words say."""
        assert self._eagerness is not None
        try:
            early.text = text = await asyncio.shield(early.stt)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the hangover ends the turn instead
            _LOGGER.debug("Early transcription failed: %s", type(err).__name__)
            early.resumed = True  # the utterance's end transcribes it again
            return
        recognised = False
        if (
            self._recognise is not None
            and not unfinished(text)
            and self._eagerness.level is not Eagerness.HIGH
            and not early.resumed
        ):
            try:
                async with asyncio.timeout(self.options.stt_timeout_s):
                    recognised = await self._recognise(text)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - judged by the words alone
                _LOGGER.debug("Intent recognition failed: %s", type(err).__name__)
        if early.resumed or track is not self._utterance or self._ended:
            return  # the user went on, or the hangover ended the utterance meanwhile
        verdict = judge_turn(text, self._eagerness, recognised=recognised)
        if verdict is TurnVerdict.WAIT or track.speculated or self._stt_pending():
            # One early push per utterance; and none while an older utterance
            # waits for its words (their push would cut it).
            return
        self._push_early(track, early, text, held=verdict is TurnVerdict.HOLD)

    @property
    def _ended(self) -> bool:
        return self.state is SessionState.ENDED

    def _push_early(
        self, track: _Track, early: _Early, text: str, *, held: bool
    ) -> None:
        """Answer the words so far, revocable until the answer is heard.

        ``held`` (HOLD): the answer plays only once confirmed; else (END) it plays
        as soon as it comes. Either way the kernel calls no tool until confirmed.
        """
        track.speculated = True
        if held:
            self.stats.speculations += 1
        else:
            self.stats.early_ends += 1
        if self.state is SessionState.PAUSED or self._answer is not None:
            self.stats.barge_ins += 1  # words over the answer: it is cut
        self._cut_answer()
        ticket = self._child.push(text, speculative=True)
        self.stats.pushes += 1
        early.ticket = ticket
        early.held = held
        self._early = early
        self._pending_rounds.add(ticket.seq)
        ticket.outcome.add_done_callback(partial(self._round_settled, ticket.seq))
        self._set_state(SessionState.LISTENING)

    def _speech_resumed(self, early: _Early) -> None:
        """Drop the verdict of a short silence the user spoke on after."""
        early.resumed = True
        early.stt.cancel()
        if early is not self._early or early.heard:
            # No early push, or its answer is being heard: a barge-in like any
            # other; the words of the whole utterance decide (_transcribed).
            return
        self._early = None
        self.stats.preempted += 1
        seq = early.ticket.seq
        if self._answer is not None and self._answer.seq == seq:
            self._cut_answer()  # nothing of it went out: nothing was heard
        self._child.withdraw(seq)

    def _early_heard(self, early: _Early) -> None:
        """Close the revocable window: the early push's answer goes out."""
        early.heard = True
        if not self._voice_barge_in:
            # The mic hears the answer and the user's voice may not interrupt
            # it: the turn is over here (what the utterance hears now is echo).
            self._turn_over(early)

    def _turn_over(self, early: _Early) -> None:
        """End the utterance of a heard early push here and confirm it."""
        self.stats.utterances += 1
        self._restart_segmenter()
        self._utterance = _Track()
        self._confirm(early)

    def _confirm(self, early: _Early) -> None:
        """Confirm the early push: the hangover found no more words (or no voice can)."""
        self._early = None
        seq = early.ticket.seq
        if not self._child.confirm(seq):
            if not early.heard:
                self._transcribed(early.text)  # it failed meanwhile: ask again
            return
        self.stats.confirmed_speculations += 1
        answer = self._answer
        if answer is not None and answer.seq == seq and answer.hold is not None:
            answer.hold.set()

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stt_pending(self) -> bool:
        return self._transcribing or not self._utterances.empty()

    def _count_silence(self) -> None:
        if (
            self.options.end_silence_ms <= 0
            or self.state is not SessionState.LISTENING
            or self._answer is not None
            or self._pending_rounds
            or self._in_utterance
            or self._stt_pending()
        ):
            self._silent_ms = 0
            return
        self._silent_ms += FRAME_MS
        if self._silent_ms < self.options.end_silence_ms:
            return
        self._set_state(SessionState.ENDED)
        if self._on_end is not None:
            self._on_end()

    async def _transcribe_loop(self) -> None:
        while True:
            utterance = await self._utterances.get()
            self._transcribing = True
            try:
                async with asyncio.timeout(self.options.stt_timeout_s):
                    if utterance.words is not None:
                        text = (await utterance.words).strip()
                    else:
                        text = (await self._stt(utterance.pcm)).strip()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - one utterance lost, not the session
                self.stats.stt_errors += 1
                _LOGGER.error(
                    "Speech-to-text failed for an utterance: %s", type(err).__name__
                )
                text = ""
            finally:
                self._transcribing = False
            self._transcribed(text, utterance.early)

    def _transcribed(self, text: str, early: _Early | None = None) -> None:
        """Push the words of an utterance (``early``: its heard early push)."""
        if self.state is SessionState.ENDED:
            return
        if early is not None and early is self._early:
            if not text or same_words(text, early.text):
                # The same words (a cough, a breath): the answer stands.
                self._confirm(early)
                text = ""
            else:
                self.stats.spoken_over_ends += 1
        if text:
            if self.state is SessionState.PAUSED or self._answer is not None:
                self.stats.barge_ins += 1
            self._early = None  # the push cuts it (latest wins)
            self._cut_answer()
            ticket = self._child.push(text)
            self.stats.pushes += 1
            self._pending_rounds.add(ticket.seq)
            ticket.outcome.add_done_callback(partial(self._round_settled, ticket.seq))
            self._set_state(SessionState.LISTENING)
        elif (
            self.state is SessionState.PAUSED
            and not self._in_utterance
            and not self._stt_pending()
        ):
            self._resume()

    def _round_settled(self, seq: int, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: the kernel's caller reports it
        self.output_end(seq)

    # --- playback ------------------------------------------------------------------

    def _pause(self, onset_frame: int | None) -> None:
        self.player.pause()
        self.stats.pauses += 1
        self._paused_at_ms = self.mic_ms
        self.stats.last_pause_mic_ms = self.mic_ms
        self.stats.last_onset_mic_ms = (
            (onset_frame - 1) * FRAME_MS if onset_frame is not None else None
        )
        self.stats.pause_mic_ms.append(self.mic_ms)
        self._set_state(SessionState.PAUSED)

    def _resume(self) -> None:
        self.stats.false_barge_ins += 1
        self.stats.pause_gaps_ms.append(self.mic_ms - self._paused_at_ms)
        self.player.resume()
        self._set_state(
            SessionState.RESUMING if self._gate_open else SessionState.SPEAKING
        )

    def _open_answer(self, seq: int) -> _Answer:
        early = self._early
        held = early is not None and early.held and early.ticket.seq == seq
        answer = _Answer(seq, self.options.early_first_clause_chars, held=held)
        self._answer = answer
        answer.task = asyncio.get_running_loop().create_task(
            self._speak(answer), name=f"rtvoice duplex answer {seq}"
        )
        self._tasks.add(answer.task)
        answer.task.add_done_callback(self._tasks.discard)
        return answer

    def _cut_answer(self) -> None:
        """Stop the answer now and acknowledge what was heard of it (final)."""
        answer = self._answer
        if answer is None:
            return
        self._answer = None
        self._last_closed_seq = max(self._last_closed_seq, answer.seq)
        played = self.player.paused_at_played
        if played is None or self.player.state is not PlayerState.PAUSED:
            played = self.player.played_bytes()
        self.player.stop()
        if answer.task is not None:
            answer.task.cancel()
        self._child.acknowledge(
            answer.seq, answer.ledger.heard_chars(played), final=True
        )
        if self.state is not SessionState.ENDED:
            self._set_state(SessionState.LISTENING)

    async def _speak(self, answer: _Answer) -> None:
        while (sentence := await self._next_sentence(answer)) is not None:
            if answer.hold is not None and answer.synthesised:
                await answer.hold.wait()  # held: only the first sentence ahead
            self._acknowledge_progress(answer)
            await self._synthesise(answer, sentence)
            answer.synthesised = True
        self.player.finish()
        await self.player.played()
        if self._answer is not answer:
            return
        self._answer = None
        self._last_closed_seq = max(self._last_closed_seq, answer.seq)
        self._child.acknowledge(answer.seq, answer.splitter.length, final=True)
        self._set_state(SessionState.LISTENING)

    async def _next_sentence(self, answer: _Answer) -> Sentence | None:
        """Wait for the answer's next sentence (None: its text ended).

        While the text waits for tool calls, what was queued is acknowledged once it
        has played: the kernel commits the tool group with the text heard by then,
        and the user heard the preamble during the tool, not after it.
        """
        if not (answer.text_paused and answer.sentences.empty()):
            return await answer.sentences.get()
        getter = asyncio.ensure_future(answer.sentences.get())
        try:
            left = self.player.queued_bytes + self.player.device_queued_bytes()
            await asyncio.wait((getter,), timeout=left / BYTES_PER_MS / 1000 + 0.01)
            if not getter.done():
                self._acknowledge_progress(answer)
            return await getter
        finally:
            getter.cancel()

    async def _synthesise(self, answer: _Answer, sentence: Sentence) -> None:
        started = False
        ahead: list[bytes] = []  # synthesised while held, not played yet
        try:
            chunks = self._tts(sentence.text)
            async with _closing(chunks):
                while True:
                    async with asyncio.timeout(self.options.tts_chunk_timeout_s):
                        chunk = await anext(chunks, None)
                    if chunk is None:
                        break
                    if not chunk:
                        continue
                    if answer.hold is not None and not answer.hold.is_set():
                        ahead.append(chunk)
                        continue
                    for piece in (*ahead, chunk):
                        started = self._play(answer, sentence, piece, started)
                    ahead.clear()
            if ahead:
                assert answer.hold is not None
                await answer.hold.wait()
                for piece in ahead:
                    started = self._play(answer, sentence, piece, started)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - one sentence lost, not the answer
            self.stats.tts_errors += 1
            _LOGGER.error(
                "Text-to-speech failed for a sentence: %s", type(err).__name__
            )
            if not started:
                answer.ledger.skip(sentence)

    def _play(
        self, answer: _Answer, sentence: Sentence, chunk: bytes, started: bool
    ) -> bool:
        """Queue one chunk of the sentence's audio; True once the sentence started."""
        position = self.player.enqueue(chunk)
        if not started:
            answer.ledger.add(sentence, position)
            if self.state is SessionState.LISTENING:
                self._set_state(SessionState.SPEAKING)
        answer.ledger.extend(self.player.enqueued_bytes)
        return True

    def _acknowledge_progress(self, answer: _Answer) -> None:
        heard = answer.ledger.heard_chars(self.player.played_bytes())
        if heard > answer.acked:
            answer.acked = heard
            self._child.acknowledge(answer.seq, heard)

    async def _send_frame(self, frame: bytes) -> None:
        early = self._early
        if early is not None and not early.heard and not early.held:
            answer = self._answer
            if answer is not None and answer.seq == early.ticket.seq:
                self._early_heard(early)  # its first frame goes out
        if self._self_hearing is not None:
            self._self_hearing.played(frame_dbfs(frame))
        if self._echo is not None:
            if self.player.frame_follows:
                # Back to back on the device: the reference continues sample for
                # sample. Re-placing each frame from the mic chunks' arrival times
                # would slip it by a sample now and then (network and loop jitter),
                # and every slip is a new echo path that AEC3 must re-learn.
                self._echo.far_end(frame)
            else:  # the device's queue ran dry: this frame starts a new stretch
                at = self._timeline.sample_at(self.player.frame_play_at)
                self._echo.far_end(frame, at_sample=at)
        await self._send(frame)

    def _set_state(self, state: SessionState) -> None:
        if state is self.state:
            return
        if (
            state is SessionState.LISTENING
            and self._utterance.ignored
            and self._utterance.answer_ended_ms is None
        ):
            self._utterance.answer_ended_ms = self.mic_ms  # its echo tail begins
        self.state = state
        if self._on_state is not None:
            self._on_state(state)


@contextlib.asynccontextmanager
async def _closing(chunks: AsyncIterator[bytes]) -> AsyncIterator[None]:
    """Close an async generator when its consumer stops early (cut or error)."""
    try:
        yield
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
