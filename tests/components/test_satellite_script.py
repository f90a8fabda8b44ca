"""``scripts/satellite --duplex`` against a Home Assistant the test starts.

The script runs in this process as a developer runs it (its ``main`` with command
line arguments), against HA's real HTTP and websocket API served on 127.0.0.1 by the
harness (``hass_client`` starts the server; the token is the harness's access
token). Everything it sets up goes through that API: the Wyoming services (config
flows), the pipeline, the duplex satellite (the Realtime Voice entry's subentry flow
"Add ESPHome satellite" and its reconfigure, through the frontend's endpoints).
The entry's model is the loopback OpenAI peer; the script's own emulated satellite
and offline speech servers are real peers on 127.0.0.1. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
import socket
import wave

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.rtvoice.const import CONF_MAC, SUBENTRY_ESPHOME
from homeassistant.components.assist_pipeline.pipeline import async_get_pipelines
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from scripts import satellite
from tests.components.common import async_load_entry, openai_entry, stored_satellites
from tests.peers.openai_server import OpenAIPeer, Text

pytestmark = pytest.mark.usefixtures("socket_enabled")

LONG = (
    "The kitchen lights are on now. I also checked the living room, and every"
    " light there is off, as you asked me to leave it earlier today."
)
STOPPED = "Stopped."


@pytest.fixture
async def served(
    hass: HomeAssistant,
    tmp_path: Path,
    hass_client: ClientSessionGenerator,
    hass_access_token: str,
    openai_peer: OpenAIPeer,
) -> tuple[MockConfigEntry, list[str]]:
    """Serve HA's API as a stock HA does, with a loaded entry; (entry, --url/--token).

    Every component with HTTP views is set up before the server starts (a started
    aiohttp app takes no new routes); the TTS cache goes to ``tmp_path``.
    """
    hass.config.config_dir = str(tmp_path)  # before tts loads (its cache dir)
    entry = openai_entry(hass, openai_peer)
    await async_load_entry(hass, entry)
    for component in ("api", "websocket_api", "config", "stt", "tts", "wyoming"):
        assert await async_setup_component(hass, component, {}), component
    await hass.async_block_till_done()
    client = await hass_client()
    url = f"http://127.0.0.1:{client.server.port}"
    return entry, ["--url", url, "--token", hass_access_token]


async def test_duplex_mode_talks_over_an_answer(
    hass: HomeAssistant,
    tmp_path: Path,
    served: tuple[MockConfigEntry, list[str]],
    openai_peer: OpenAIPeer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ask, then say "stop" (after the wake word) while the long answer plays.

    The script adds the satellite through its subentry flow, prints the transcripts,
    the answer audio starting and being cut by the barge-in, and the short second
    answer heard whole; the model saw both utterances; a re-run reuses the entry.
    """
    entry, connect = served
    openai_peer.enqueue(Text(LONG))
    openai_peer.enqueue(Text(STOPPED))
    wav = tmp_path / "answer.wav"
    argv = [
        *connect,
        "--duplex",
        "--stt-port",
        "0",
        "--tts-port",
        "0",
        "--wav",
        str(wav),
        "--say",
        "turn on the kitchen lights",
        "--say",
        "/wait playing",
        "--say",
        "stop",
    ]

    assert await satellite.main(satellite.parse_args(argv)) == 0

    out = capsys.readouterr().out
    lines = out.splitlines()

    def first(text: str, after: int = -1) -> int:
        for index, line in enumerate(lines):
            if index > after and text in line:
                return index
        raise AssertionError(f"{text!r} not printed after line {after}:\n{out}")

    asked = first('you: "turn on the kitchen lights" (after the wake word')
    heard = first("transcribed: 'turn on the kitchen lights'", asked)
    starts = first("answer audio starts", heard)
    stop = first(
        'you: "stop" (after the wake word "Okay Nabu", over the answer)', starts
    )
    stops = first("answer audio stops at", stop)
    cut = first("barge-in: your words cut the answer", stops)
    assert first("transcribed: 'stop'", stops) < cut
    first("answer cut at", cut)
    second = first("answer audio starts", cut)
    assert STOPPED in lines[first("answer heard whole", second)]
    assert "barge-in mode wake_word" in out

    assert [r.messages[-1]["content"] for r in openai_peer.requests] == [
        "turn on the kitchen lights",
        "stop",
    ]
    with wave.open(str(wav), "rb") as heard_wav:
        assert heard_wav.getframerate() == 16000 and heard_wav.getnframes() > 0

    [stored] = stored_satellites(entry, SUBENTRY_ESPHOME)
    assert stored[CONF_MAC] == "02:00:00:5A:7E:01"
    satellites = [
        e.entity_id
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if e.domain == "assist_satellite"
    ]
    assert len(satellites) == 1
    # The preferred pipeline was switched for the run and switched back.
    assert [p.name for p in async_get_pipelines(hass)].count("Virtual satellite") == 1


def free_port() -> int:
    """Return a port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def run_script(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``scripts/satellite`` with ``argv``; what it printed (exit code 0)."""
    code = await satellite.main(satellite.parse_args(argv))
    out, err = capsys.readouterr()
    assert code == 0, f"{out}\n{err}"  # the script's errors go to stderr
    return out


async def test_rerun_with_echo_reuses_the_satellite(
    hass: HomeAssistant,
    tmp_path: Path,
    served: tuple[MockConfigEntry, list[str]],
    openai_peer: OpenAIPeer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A second run (its mic hearing its own speaker) reuses the stored satellite.

    In ``wake_word`` mode the echo of the answer never interrupts it: the answer
    is heard whole, no stop is printed.
    """
    entry, connect = served
    openai_peer.enqueue(Text("The kitchen lights are on."))
    openai_peer.enqueue(Text(LONG))
    # Fixed ports, as a developer's runs have (the Wyoming entries are reused).
    ports = [str(free_port()), str(free_port())]
    common = [*connect, "--duplex", "--stt-port", ports[0], "--tts-port", ports[1]]
    common += ["--wav", str(tmp_path / "answer.wav")]
    await run_script([*common, "--say", "turn on the kitchen lights"], capsys)
    out = await run_script(
        [*common, "--echo", "--say", "turn on the kitchen lights"], capsys
    )

    assert "echo 0.5x after 120 ms" in out
    assert "answer audio stops" not in out
    assert "answer heard whole" in out
    assert len(stored_satellites(entry, SUBENTRY_ESPHOME)) == 1
    satellites = [
        e.entity_id
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if e.domain == "assist_satellite"
    ]
    assert len(satellites) == 1
    assert len(openai_peer.requests) == 2


async def test_cough_and_the_barge_in_setting(
    tmp_path: Path,
    served: tuple[MockConfigEntry, list[str]],
    openai_peer: OpenAIPeer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--barge-in vad`` and a cough while the answer plays.

    The setting is stored through the satellite's reconfigure form; the cough
    pauses the answer and it resumes, so the answer is heard whole and the model
    is asked once.
    """
    _, connect = served
    openai_peer.enqueue(Text(LONG))
    out = await run_script(
        [
            *connect,
            "--duplex",
            "--stt-port",
            "0",
            "--tts-port",
            "0",
            "--wav",
            str(tmp_path / "answer.wav"),
            "--barge-in",
            "vad",
            "--say",
            "turn on the kitchen lights",
            "--say",
            "/wait playing",
            "--say",
            "/cough",
        ],
        capsys,
    )
    assert "barge-in mode vad" in out  # stored through the reconfigure form
    assert "answer audio stops at" in out
    assert "ms after your noise began" in out
    assert "answer audio resumes after" in out
    assert "answer heard whole" in out
    assert len(openai_peer.requests) == 1


async def test_a_rerun_reports_the_barge_in_mode_that_is_stored(
    tmp_path: Path,
    served: tuple[MockConfigEntry, list[str]],
    openai_peer: OpenAIPeer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 17 item 7: a run without --barge-in reads the stored mode, not the default.

    The first run stores ``vad``; the second, without the flag, said ``wake_word``.
    It also sets Realtime Voice's own assistant select, not HA esphome's.
    """
    _, connect = served
    openai_peer.enqueue(Text("The kitchen lights are on."))
    openai_peer.enqueue(Text("They are on."))
    ports = [str(free_port()), str(free_port())]
    common = [*connect, "--duplex", "--stt-port", ports[0], "--tts-port", ports[1]]
    common += ["--wav", str(tmp_path / "answer.wav")]
    first = await run_script(
        [*common, "--barge-in", "vad", "--say", "turn on the kitchen lights"], capsys
    )
    assert "barge-in mode vad" in first  # stored through the reconfigure form
    second = await run_script([*common, "--say", "turn on the kitchen lights"], capsys)
    assert "barge-in mode vad" in second
    assert "assumed to be the default" not in second


def test_pipeline_mode_takes_sleep_and_quit_and_refuses_other_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 17 item 7: ``--say "/sleep 1"`` was spoken (and crashed the recogniser)."""

    async def run(line: str) -> bool | None:
        return await satellite.pipeline_command(None, None, line, Path("unused.wav"))  # type: ignore[arg-type]

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(run("/sleep 0")) is True
        assert loop.run_until_complete(run("/sleep soon")) is False
        assert loop.run_until_complete(run("/cough")) is False
        assert loop.run_until_complete(run("/quit")) is None
        assert loop.run_until_complete(run("   ")) is True
    finally:
        loop.close()
    out = capsys.readouterr().out
    assert "/sleep takes seconds" in out
    assert "unknown command /cough in pipeline mode" in out
    args = satellite.parse_args(["--say", "/sleep 1", "--say", "hello"])
    assert not Path(args.wav).is_relative_to(Path.cwd())  # not in the repository


def test_the_internal_url_note_says_what_the_script_changed() -> None:
    """The note says the script set HA's internal URL, not that the user must.

    It read as a task left to the user ("set it to …") although the script had
    already set it and answers played (issue 17 item 7, seen again walking
    README's first use).
    """

    class FakeHass:
        url = "http://127.0.0.1:8123"

        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, object]]] = []

        async def ws(self, kind: str, **data: object) -> object:
            self.calls.append((kind, data))
            return {"internal": f"http://127.0.0.1:{closed_port}"}

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    hass = FakeHass()
    loop = asyncio.new_event_loop()
    try:
        note = loop.run_until_complete(satellite.ensure_reachable_url(hass))  # type: ignore[arg-type]
    finally:
        loop.close()
    assert ("config/core/update", {"internal_url": hass.url}) in hass.calls
    assert note is not None
    assert f"changed it to {hass.url}" in note
    assert "set it to" not in note
