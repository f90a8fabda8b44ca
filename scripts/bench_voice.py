"""Voice benchmarks through a real Home Assistant and emulated ESPHome satellites.

Rows 9-11 of ``scripts/bench`` (printed, never asserted). The script starts its own
Home Assistant (``hass`` of this venv, a temporary config folder, a free port on
127.0.0.1, onboarded through the API), and in this process: emulated satellites
(``tests/peers/esphome``, Voice PE flavour: TTS fetched over HTTP), instant Wyoming
STT/TTS (the transcript and a 0.1 s answer as soon as asked) and the loopback OpenAI
peer. Everything is added to HA through its config flows and websocket API, the same
calls as ``scripts/satellite``; HA's own ``esphome``, ``wyoming``, ``assist_pipeline``
and conversation code do the rest.

- 9: the device's last speech frame -> first byte of the answer audio at the device,
  Realtime Voice (openai brain on the instant peer) vs HA's built-in agent, same
  pipeline otherwise (alternating utterances). It includes HA's end-of-speech
  detection (the firmware streams silence until HA's VAD ends the utterance) and the
  ffmpeg conversion of the answer for the media player, both the same for the two.
- 10: pipeline-mode barge-in: while the peer holds an answer open, the device starts a
  new run (``Interrupt.RESTART``: a firmware that sends a new request mid-answer) ->
  the peer sees the hang-up.
- 11: CPU of the HA process per satellite streaming mic audio at real-time pace, with
  20 satellites streaming at once, over HA's idle baseline. The emulators and speech
  servers run in this process, so HA's CPU is measured alone (``/proc/<pid>/stat``).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
import contextlib
import os
from pathlib import Path
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from wyoming.asr import Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event, async_write_event
from wyoming.tts import Synthesize

from scripts.bench_kernel import Row, pct
from scripts.satellite import Hass, HassError, ensure_wyoming, entity_of
from tests.peers.esphome import EmulatedDevice, EventType, Interrupt, Run, State
from tests.peers.openai_server import DEFAULT_MODEL, Hang, OpenAIPeer, Text
from tests.peers.speech import speak
from tests.peers.wyoming_speech import (
    STT_PROGRAM,
    TTS_PROGRAM,
    WyomingSttServer,
    WyomingTtsServer,
    _Utterance as Utterance,
)

ROOT = Path(__file__).resolve().parent.parent
LOG = Path(tempfile.gettempdir()) / "rtvoice-bench-voice-hass.log"
PHRASE = "turn on the kitchen lights"
ANSWER = "Turned on the kitchen lights."
API_KEY = "sk-bench-0123456789"
HA_AGENT = "conversation.home_assistant"
PIPELINE_HA = "bench: HA agent"
PIPELINE_RV = "bench: Realtime Voice"
MID_ANSWER = 0.05  # seconds into the held answer when the device barges in
SAFETY = 60.0  # seconds: a safety net against hangs, never a synchronisation
CLK_TCK = 100  # os.sysconf("SC_CLK_TCK") on Linux
CONFIGURATION = """\
homeassistant:
  internal_url: http://127.0.0.1:{port}
http:
  server_host: 127.0.0.1
  server_port: {port}
conversation:
assist_pipeline:
input_boolean:
  kitchen_lights:
    name: Kitchen Lights
logger:
  default: warning
  logs:
    custom_components.rtvoice: debug
{extra_logs}"""
# --debug-ha: HA's own side of a barge-in (the esphome entity's pipeline start and
# abort, the pipeline's stages) in the log, with millisecond stamps.
HA_DEBUG_LOGS = """    homeassistant.components.esphome.assist_satellite: debug
    homeassistant.components.assist_pipeline: debug
    homeassistant.components.assist_satellite: debug
    custom_components.bench_probe: debug
bench_probe:
"""
# --debug-ha also loads this probe into HA: it logs every write of the esphome
# satellite's ``_pipeline_task`` (which task, written by which function, in which
# task) and what ``_cancel_running_pipeline`` finds and cancels. Diagnostics only.
PROBE_MANIFEST = """\
{"domain": "bench_probe", "name": "Bench probe", "version": "0.0.0",
 "documentation": "https://example.invalid", "codeowners": [],
 "dependencies": [], "requirements": [], "iot_class": "local_push"}
"""
PROBE = '''\
"""Logs how HA's esphome satellite tracks its pipeline task (bench diagnostics)."""

import asyncio
import logging
import sys

from homeassistant.components.assist_satellite import entity as sat_entity
from homeassistant.components.esphome import assist_satellite as esa

_LOGGER = logging.getLogger(__name__)


def _desc(task):
    if task is None:
        return "None"
    state = "done" if task.done() else "running"
    return f"{task.get_name()}#{id(task) % 100000} ({state})"


def _get(self):
    return self.__dict__.get("_probe_task")


def _set(self, task):
    _LOGGER.debug(
        "_pipeline_task %s -> %s, written by %s in %s",
        _desc(self.__dict__.get("_probe_task")),
        _desc(task),
        sys._getframe(1).f_code.co_name,
        _desc(asyncio.current_task()),
    )
    self.__dict__["_probe_task"] = task


_original_cancel = sat_entity.AssistSatelliteEntity._cancel_running_pipeline


async def _cancel_running_pipeline(self):
    found = self._pipeline_task
    _LOGGER.debug(
        "_cancel_running_pipeline in %s finds %s",
        _desc(asyncio.current_task()),
        _desc(found),
    )
    try:
        await _original_cancel(self)
    finally:
        _LOGGER.debug(
            "_cancel_running_pipeline in %s done (%s %s)",
            _desc(asyncio.current_task()),
            _desc(found),
            "cancelled" if found is not None and found.cancelled() else "",
        )


async def async_setup(hass, config):
    esa.EsphomeAssistSatellite._pipeline_task = property(_get, _set)
    sat_entity.AssistSatelliteEntity._cancel_running_pipeline = (
        _cancel_running_pipeline
    )
    return True
'''


class InstantStt(WyomingSttServer):
    """Answers the phrase as soon as the audio stops (no recognition).

    ``numbered``: each transcript ends with its STT request's number, so a model
    request and the device run it came from can be told apart (row 10's log).
    """

    numbered = False
    count = 0

    async def _answer(self, utterance: Utterance, writer: asyncio.StreamWriter) -> None:
        self.count += 1
        text = f"{PHRASE} number {self.count}" if self.numbered else PHRASE
        await async_write_event(Transcript(text=text).event(), writer)


class InstantTts(WyomingTtsServer):
    """Answers 0.1 s of silence at once, whatever the text."""

    async def _handle(self, event: Event, writer: asyncio.StreamWriter) -> None:
        if not Synthesize.is_type(event.type):
            return
        await async_write_event(
            AudioStart(rate=16000, width=2, channels=1).event(), writer
        )
        chunk = AudioChunk(rate=16000, width=2, channels=1, audio=bytes(3200))
        await async_write_event(chunk.event(), writer)
        await async_write_event(AudioStop().event(), writer)


def free_port() -> int:
    """Return a free TCP port of 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def stalled(pid: int, stall: float, period: float) -> Any:
    """Pause the process ``pid`` for ``stall`` seconds of every ``period`` (a thread).

    A busy machine in miniature: Home Assistant's event loop stops between two of
    its iterations at random points while the emulators in this process go on, so
    requests pile up and are handled together when it resumes.
    """
    done = threading.Event()

    def pause() -> None:
        while not done.wait(period - stall):
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(stall)
            finally:
                os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=pause, name="stall-hass", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@contextlib.asynccontextmanager
async def home_assistant(
    session: aiohttp.ClientSession, *, log_path: Path = LOG, debug_ha: bool = False
) -> AsyncIterator[tuple[Hass, int]]:
    """Start a fresh Home Assistant, onboarded; yield (API client, pid)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="rtvoice-bench-") as config:
        (Path(config) / "configuration.yaml").write_text(
            CONFIGURATION.format(
                port=port, extra_logs=HA_DEBUG_LOGS if debug_ha else ""
            )
        )
        (Path(config) / "custom_components").mkdir()
        (Path(config) / "custom_components" / "rtvoice").symlink_to(
            ROOT / "custom_components" / "rtvoice"
        )
        if debug_ha:
            probe = Path(config) / "custom_components" / "bench_probe"
            probe.mkdir()
            (probe / "manifest.json").write_text(PROBE_MANIFEST)
            (probe / "__init__.py").write_text(PROBE)
        log = log_path.open("w")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "homeassistant",
            "-c",
            config,
            "--skip-pip",
            # Not the checkout: its custom_components/ would hide the config's.
            cwd=config,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            hass = Hass(url, await onboard(session, url, process), session)
            try:
                yield hass, process.pid
            finally:
                await hass.close()
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    process.kill()
                    await process.wait()
            log.close()


async def onboard(
    session: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process
) -> str:
    """Wait for HA's onboarding, create the owner; a long-lived token."""
    deadline = time.monotonic() + 300
    while True:  # polling a starting process: nothing to await instead
        if process.returncode is not None:
            raise RuntimeError("Home Assistant exited during startup")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"{url}/api/onboarding") as response:
                if response.status == 200:
                    break
        if time.monotonic() > deadline:
            raise RuntimeError("Home Assistant did not start in 300 s")
        await asyncio.sleep(0.5)
    client = f"{url}/"
    async with session.post(
        f"{url}/api/onboarding/users",
        json={
            "client_id": client,
            "name": "Bench",
            "username": "bench",
            "password": "bench-bench",
            "language": "en",
        },
    ) as response:
        code = (await response.json())["auth_code"]
    async with session.post(
        f"{url}/auth/token",
        data={"grant_type": "authorization_code", "code": code, "client_id": client},
    ) as response:
        access = (await response.json())["access_token"]
    hass = Hass(url, access, session)
    try:
        for step in ("core_config", "analytics"):
            await hass.rest("POST", f"onboarding/{step}", {})
        token: str = await hass.ws(
            "auth/long_lived_access_token", client_name="bench", lifespan=1
        )
    finally:
        await hass.close()
    return token


async def add_device(hass: Hass, device: EmulatedDevice) -> tuple[str, str]:
    """Add a satellite through the esphome flow; (entry id, pipeline select)."""
    result = await hass.flow("esphome", {"host": device.host, "port": device.port})
    entry_id = str(result["result"]["entry_id"])
    await asyncio.wait_for(device.wait_for_voice_client(), SAFETY)
    for _ in range(100):  # registration follows the connection closely
        try:
            select = entity_of(await hass.entities(), entry_id, "select", "-pipeline")
        except HassError:
            await asyncio.sleep(0.1)
        else:
            return entry_id, select
    raise RuntimeError("no pipeline select")


async def select_pipeline(hass: Hass, select: str, name: str) -> None:
    """Point a satellite at a pipeline (its "Assistant" select)."""
    await hass.rest(
        "POST",
        "services/select/select_option",
        {"entity_id": select, "option": name},
    )


async def make_pipeline(hass: Hass, name: str, agent: str, stt: str, tts: str) -> None:
    """Create a pipeline."""
    await hass.ws(
        "assist_pipeline/pipeline/create",
        name=name,
        language="en",
        conversation_engine=agent,
        conversation_language="en",
        stt_engine=stt,
        stt_language="en",
        tts_engine=tts,
        tts_language="en",
        tts_voice=None,
        wake_word_entity=None,
        wake_word_id=None,
    )


async def rv_agent(hass: Hass, peer: OpenAIPeer) -> str:
    """Add Realtime Voice (openai brain on the peer); its conversation entity."""
    result = await hass.flow(
        "rtvoice",
        {"next_step_id": "openai"},
        {
            "name": "Realtime Voice",
            "base_url": peer.base_url,
            "api_key": API_KEY,
            "model": DEFAULT_MODEL,
        },
    )
    entry_id = result["result"]["entry_id"]
    for _ in range(100):
        with contextlib.suppress(HassError):
            return entity_of(await hass.entities(), entry_id, "conversation")
        await asyncio.sleep(0.1)
    raise RuntimeError("Realtime Voice made no conversation entity")


async def start_run(device: EmulatedDevice, pcm: bytes, wake_word: str) -> Run:
    """Say ``pcm`` after ``wake_word`` once the device is idle; the run.

    Each run has its own wake word phrase: HA refuses the same phrase within 2 s
    (``duplicate_wake_up_detected``, meant for satellites hearing the same person).
    """
    since = device.mark()
    if device.state is not State.IDLE:
        await asyncio.wait_for(device.wait_for_state(State.IDLE, since), SAFETY)
    run = device.say(pcm, wake_word=wake_word)
    if run is None:
        raise RuntimeError(f"the device was busy ({device.state})")
    return run


async def utterance(device: EmulatedDevice, pcm: bytes, wake_word: str) -> Run:
    """Say ``pcm``; the run once it ended."""
    run = await start_run(device, pcm, wake_word)
    await asyncio.wait_for(run.ended.wait(), SAFETY)
    return run


def answer_latency(
    device: EmulatedDevice, run: Run, played_before: int
) -> tuple[float, float]:
    """Last speech frame -> first byte of the answer audio, and STT end -> it (s)."""
    if len(device.playbacks) <= played_before:
        raise RuntimeError(f"no answer audio: {run.end_reason} {run.event_types()}")
    first = device.playbacks[played_before].first_byte_at
    [stt_end] = [e.at for e in run.events if e.detail["type"] == EventType.STT_END]
    assert first is not None and run.last_speech_frame_at is not None
    return first - run.last_speech_frame_at, first - stt_end


async def bench_answer(
    hass: Hass, device: EmulatedDevice, select: str, pcm: bytes, trials: int
) -> Row:
    """9: end of utterance -> first answer byte, HA agent vs Realtime Voice."""
    results: dict[str, list[float]] = {PIPELINE_HA: [], PIPELINE_RV: []}
    after_stt: dict[str, list[float]] = {PIPELINE_HA: [], PIPELINE_RV: []}
    for name in (PIPELINE_HA, PIPELINE_RV):  # warm-up: first runs load things
        await select_pipeline(hass, select, name)
        await utterance(device, pcm, f"warm-up {name}")
    for trial in range(2 * trials):
        name = (PIPELINE_HA, PIPELINE_RV)[trial % 2]
        await select_pipeline(hass, select, name)
        played = len(device.playbacks)
        run = await utterance(device, pcm, f"answer {trial}")
        total, agent_part = answer_latency(device, run, played)
        results[name].append(total)
        after_stt[name].append(agent_part)
    ha, rv = results[PIPELINE_HA], results[PIPELINE_RV]
    ha_stt, rv_stt = after_stt[PIPELINE_HA], after_stt[PIPELINE_RV]
    return Row(
        "9 voice: last speech frame → first answer byte at the device"
        " (HA VAD end + STT + agent + TTS + ffmpeg), Realtime Voice vs HA's agent",
        f"RV p50 {pct(rv, 50) * 1e3:.0f} ms, p99 {pct(rv, 99) * 1e3:.0f} ms;"
        f" HA agent p50 {pct(ha, 50) * 1e3:.0f} ms, p99 {pct(ha, 99) * 1e3:.0f} ms;"
        f" ratio p50 {pct(rv, 50) / pct(ha, 50):.3f}, p99 {pct(rv, 99) / pct(ha, 99):.3f}"
        f" ({trials} utterances each, alternating); of which STT end → first byte:"
        f" RV p50 {pct(rv_stt, 50) * 1e3:.1f} ms, p99 {pct(rv_stt, 99) * 1e3:.1f} ms,"
        f" HA agent p50 {pct(ha_stt, 50) * 1e3:.1f} ms,"
        f" p99 {pct(ha_stt, 99) * 1e3:.1f} ms",
        "ratio ≤ 1.10",
    )


def user_text(request: Any) -> str:
    """Return the last user message of a model request."""
    users = [m for m in request.messages if m.get("role") == "user"]
    content = users[-1].get("content", "") if users else ""
    return content if isinstance(content, str) else str(content)


def stt_text(run: Run) -> str:
    """Return the transcript the device got for a run ("" before STT ended)."""
    for entry in run.events:
        if entry.detail["type"] == EventType.STT_END:
            return str(entry.detail["data"].get("text", ""))
    return ""


def request_log(
    device: EmulatedDevice, peer: OpenAIPeer, watched: dict[int, str]
) -> list[str]:
    """One line per model request: its words, the run that asked, watched, hung up."""
    runs_by_text = {stt_text(run): run for run in device.runs if stt_text(run)}
    lines = []
    for number, request in enumerate(peer.requests, 1):
        text = user_text(request)
        run = runs_by_text.get(text)
        origin = (
            f"run {run.number} '{run.wake_word_phrase}' ended {run.end_reason!r}"
            if run is not None
            else "no device run with these words"
        )
        if request.disconnected_at is not None:
            fate = (
                f"hung up after {request.disconnected_at - request.received_at:.3f} s"
            )
        elif request.completed:
            fate = "completed"
        else:
            fate = "still open"
        lines.append(
            f"  request {number}: {text!r} from {origin};"
            f" {watched.get(number, 'not watched')}; {fate}"
        )
    return lines


async def bench_barge_in(
    device: EmulatedDevice,
    peer: OpenAIPeer,
    pcm: bytes,
    trials: int,
    *,
    barge_at: float = MID_ANSWER,
    log: list[str] | None = None,
) -> Row:
    """10: the device starts a new run mid-answer -> the peer sees the hang-up.

    Every model answer starts and then holds the stream open. A barged-in run ends on
    the device at the cancelled run's late ``RUN_END`` (firmware logic); HA's side of
    it is cancelled by the next trial's start, so exactly one answer is open at each
    barge-in: the one measured.
    """
    loop = asyncio.get_running_loop()
    clock = time.perf_counter() - loop.time()  # the peer stamps with perf_counter
    latencies: list[float] = []
    watched: dict[int, str] = {}
    peer.default_reply(Text("Well, let me see"), Hang())
    retried = 0
    try:
        for trial in range(3 * trials):
            if len(latencies) == trials:
                break
            since, seen = device.mark(), len(peer.requests)
            first = await start_run(device, pcm, f"barge {trial} a")
            thinking = asyncio.ensure_future(
                device.wait_for_event(EventType.INTENT_START, since=since)
            )
            ended = asyncio.ensure_future(first.ended.wait())
            await asyncio.wait(
                [thinking, ended], timeout=SAFETY, return_when=asyncio.FIRST_COMPLETED
            )
            thinking.cancel()
            ended.cancel()
            if not thinking.done() or thinking.cancelled():
                # The previous barge-in's late RUN_END ended this run on the device
                # (firmware logic): not a trial.
                retried += 1
                continue
            number = seen + 1
            while True:  # skip the previous trial's round, cancelled by this run
                request = await asyncio.wait_for(peer.wait_for_request(number), SAFETY)
                if not request.disconnected.is_set():
                    break
                number += 1
            # Mid-answer: the first words were streamed, the answer is held open.
            await asyncio.sleep(barge_at)
            if request.disconnected.is_set():
                retried += 1
                continue
            second = device.say(
                pcm, wake_word=f"barge {trial} b", interrupt=Interrupt.RESTART
            )
            assert second is not None
            if log is not None:
                watched[number] = (
                    f"watched by trial {trial} (its run {first.number} 'barge {trial} a',"
                    f" barged by run {second.number})"
                )
            await asyncio.wait_for(request.disconnected.wait(), SAFETY)
            assert request.disconnected_at is not None
            latencies.append(request.disconnected_at - clock - second.requested_at)
            await asyncio.wait_for(first.ended.wait(), SAFETY)
            await asyncio.wait_for(second.ended.wait(), SAFETY)
    finally:
        peer.default_reply(Text(ANSWER))
        if log is not None:
            log += request_log(device, peer, watched)
    slow = sum(1 for lat in latencies if lat > 1.0)
    return Row(
        "10 voice: pipeline-mode barge-in, device starts a new run mid-answer → peer"
        " sees the hang-up",
        f"p50 {pct(latencies, 50) * 1e3:.1f} ms, p99 {pct(latencies, 99) * 1e3:.1f} ms"
        f" ({len(latencies)} trials, {barge_at * 1e3:.0f} ms into the answer,"
        f" {slow} not hung up within 1 s;"
        f" {retried} runs ended on the device by the previous barge-in's late"
        " RUN_END before reaching the agent, not counted)",
        "p99 ≤ 20 ms",
    )


async def bench_cpu(
    hass_pid: int, devices: list[EmulatedDevice], pcm: bytes, window: float
) -> Row:
    """11: HA's CPU per satellite streaming at real-time pace, all at once."""
    await asyncio.sleep(1.0)  # let the previous rows' work settle (a measurement gap)
    c0, t0 = process_cpu(hass_pid), time.monotonic()
    await asyncio.sleep(window)
    idle = (process_cpu(hass_pid) - c0) / (time.monotonic() - t0)
    runs = [
        await start_run(device, pcm, f"stream {n}") for n, device in enumerate(devices)
    ]
    await asyncio.gather(*(asyncio.wait_for(r.streaming.wait(), SAFETY) for r in runs))
    await asyncio.sleep(1.0)  # past the start of every run
    own0 = time.process_time()
    c0, t0 = process_cpu(hass_pid), time.monotonic()
    await asyncio.sleep(window)
    busy = (process_cpu(hass_pid) - c0) / (time.monotonic() - t0)
    own = (time.process_time() - own0) / window
    still = sum(1 for run in runs if run.mic_stopped_at is None)
    await asyncio.gather(*(asyncio.wait_for(run.ended.wait(), SAFETY) for run in runs))
    per = (busy - idle) / len(devices)
    return Row(
        f"11 voice: HA CPU per satellite streaming at real-time pace,"
        f" {len(devices)} at once ({window:.0f} s window)",
        f"{per * 100:.2f} % of one core per satellite; HA {busy * 100:.0f} % busy vs"
        f" {idle * 100:.1f} % idle; {still}/{len(devices)} still streaming at the end"
        f" of the window; emulators + speech servers (this process) {own * 100:.0f} %",
        f"{len(devices)} satellites fit in 2 cores",
    )


async def main(args: argparse.Namespace) -> None:
    """Set everything up, run the rows, print them."""
    rows = {"9", "10", "11"}
    if args.only:
        rows &= {r.strip() for r in args.only.split(",")}
    if not rows:
        return
    short = await asyncio.to_thread(speak, PHRASE, lead_ms=100, tail_ms=0)
    long = await asyncio.to_thread(
        speak,
        " and ".join(["turn on the kitchen lights", "dim the living room"] * 4),
        tail_ms=0,
    )
    async with (
        aiohttp.ClientSession() as session,
        home_assistant(session, log_path=args.hass_log, debug_ha=args.debug_ha) as (
            hass,
            pid,
        ),
        InstantStt([PHRASE], record=False) as stt_server,
        InstantTts(record=False) as tts_server,
        OpenAIPeer(api_key=API_KEY, models=[DEFAULT_MODEL]) as peer,
        contextlib.AsyncExitStack() as stack,
    ):
        peer.default_reply(Text(ANSWER))
        stt_entry = await ensure_wyoming(hass, STT_PROGRAM, stt_server.port)
        tts_entry = await ensure_wyoming(hass, TTS_PROGRAM, tts_server.port)
        entities = await hass.entities()
        stt = entity_of(entities, stt_entry, "stt")
        tts = entity_of(entities, tts_entry, "tts")
        agent = await rv_agent(hass, peer)
        await make_pipeline(hass, PIPELINE_HA, HA_AGENT, stt, tts)
        await make_pipeline(hass, PIPELINE_RV, agent, stt, tts)
        count = args.satellites if "11" in rows else 1
        devices: list[EmulatedDevice] = []
        selects: list[str] = []
        for number in range(count):
            device = await stack.enter_async_context(
                EmulatedDevice(
                    name=f"bench-{number}",
                    friendly_name=f"Bench {number}",
                    mac_address=f"02:00:00:BE:00:{number:02X}",
                )
            )
            _, select = await add_device(hass, device)
            await select_pipeline(hass, select, PIPELINE_RV)
            devices.append(device)
            selects.append(select)
        if "9" in rows:
            show(await bench_answer(hass, devices[0], selects[0], short, args.trials))
        if "10" in rows:
            await select_pipeline(hass, selects[0], PIPELINE_RV)
            log: list[str] | None = [] if args.log_requests else None
            stt_server.numbered = args.log_requests
            with (
                stalled(pid, args.stall_ha / 1e3, args.stall_period / 1e3)
                if args.stall_ha
                else contextlib.nullcontext()
            ):
                row = await bench_barge_in(
                    devices[0],
                    peer,
                    short,
                    args.trials,
                    barge_at=args.barge_at,
                    log=log,
                )
            show(row)
            stt_server.numbered = False
            if log is not None:
                print("row 10, every model request:\n" + "\n".join(log), flush=True)
        if "11" in rows:
            show(await bench_cpu(pid, devices, long, args.window))
        for device in devices:
            if device.voice.errors:
                print(f"emulator errors: {device.voice.errors}", file=sys.stderr)


def show(row: Row) -> None:
    """Print one row of the table (at once: the next row takes a while)."""
    print(f"{row.name} | {row.measured} | {row.target}", flush=True)


def _parse() -> Any:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--trials", type=int, default=60, help="rows 9 and 10: utterances"
    )
    parser.add_argument("--satellites", type=int, default=20, help="row 11")
    parser.add_argument("--window", type=float, default=5.0, help="row 11: seconds")
    parser.add_argument(
        "--barge-at",
        type=float,
        default=MID_ANSWER,
        help="row 10: seconds after the peer saw the request (0.001: the open question)",
    )
    parser.add_argument(
        "--log-requests",
        action="store_true",
        help="row 10: print every model request, the run it came from, its fate",
    )
    parser.add_argument(
        "--hass-log", type=Path, default=LOG, help=f"HA's log file (default {LOG})"
    )
    parser.add_argument(
        "--debug-ha",
        action="store_true",
        help="debug logs of HA's esphome satellite and Assist pipeline in the log",
    )
    parser.add_argument(
        "--stall-ha",
        type=float,
        default=0.0,
        help="row 10: pause HA's process this many ms of every --stall-period",
    )
    parser.add_argument(
        "--stall-period", type=float, default=10.0, help="row 10: ms (--stall-ha)"
    )
    parser.add_argument("--quick", action="store_true", help="10 trials, 5 satellites")
    parser.add_argument("--only", help="comma-separated row numbers (9,10,11)")
    # scripts/bench passes the other benchmarks' options too.
    parsed, _unknown = parser.parse_known_args()
    if parsed.quick:
        parsed.trials, parsed.satellites = 10, 5
    return parsed


if __name__ == "__main__":
    asyncio.run(main(_parse()))
