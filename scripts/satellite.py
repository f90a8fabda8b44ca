"""A virtual ESP32 voice satellite for a running ``scripts/develop`` (no hardware).

Starts, in this process, an emulated ESPHome voice satellite (``tests/peers/esphome``,
a Voice PE without its speaker: TTS is fetched over HTTP as the real one does) and
the offline Wyoming speech servers (``tests/peers/wyoming_speech``: pocketsphinx for
known phrases, espeak-ng), then adds them to Home Assistant through its own API, as a
user would in the UI:

- the two Wyoming services (config flow of HA's ``wyoming`` integration),
- a Realtime Voice agent (the first one configured, else a new entry whose brain is
  HA's built-in agent, so no model or API key is needed),
- an Assist pipeline "Virtual satellite" (Wyoming STT -> Realtime Voice -> Wyoming
  TTS), selected on the satellite's own "Assistant" select (other satellites and the
  preferred pipeline are left alone),
- the satellite (config flow of HA's ``esphome`` integration).

Running it again reuses all of these (the ESPHome entry is matched by the device's
MAC and gets the new port; Wyoming entries by their program names; the pipeline by
its name). Then it says phrases through the satellite (``--say``, or typed at the
prompt) and prints what HA recognised, the answer, timings, and writes the answer
audio to a WAV file. While it runs, HA's device page shows the satellite as it shows
a real one (state, pipeline, wake word, mute switch, media player).

Recognition is for known phrases only (a grammar of ``--phrase``s, the demo's
commands and what is said), not general speech recognition.

``--duplex``: Realtime Voice owns the satellite instead (added to its entry with
"Add ESPHome satellite", as a user does; HA's esphome satellite entity for the same
device is disabled). The mic streams for the whole
conversation and typed lines are spoken into it at once, also over an answer;
``scripts/satellite_duplex.py`` prints what happens (docs/development.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass
import itertools
import os
from pathlib import Path
import sys
import tempfile
from typing import Any
import wave

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from yarl import URL

from scripts.satellite_duplex import DuplexConsole
from tests.peers.esphome import EmulatedDevice, EventType, Feature, Run
from tests.peers.speech import speak
from tests.peers.wyoming_speech import (
    STT_PROGRAM,
    TTS_PROGRAM,
    WyomingSttServer,
    WyomingTtsServer,
)

RTVOICE = "rtvoice"
PIPELINE_NAME = "Virtual satellite"
DEFAULT_PHRASES = [
    "turn on the kitchen lights",
    "turn off the kitchen lights",
    "turn on the living room lights",
    "turn off the living room lights",
    "what time is it",
    "stop",
]
TOKEN_HELP = """\
A long-lived access token: in Home Assistant open your user profile (click your
name at the bottom left, or http://localhost:8123/profile/security), tab
"Security", "Long-lived access tokens", "Create token"; copy it once shown.
Pass it as --token or in the environment variable HASS_TOKEN."""
RUN_TIMEOUT = 60.0  # seconds: a safety net for one spoken request
FLOW = "config/config_entries/flow"
SUBENTRY_FLOW = "config/config_entries/subentries/flow"
ESPHOME_SATELLITE = "esphome_satellite"  # Realtime Voice's subentry type
DEVICE_IDENTITY: dict[str, Any] = {
    "name": "virtual-satellite",
    "friendly_name": "Virtual Satellite",
    "mac_address": "02:00:00:5A:7E:01",
    "model": "Virtual satellite (scripts/satellite)",
    "manufacturer": "Realtime Voice",
}
DUPLEX_FIRMWARE = "2026.10.0"  # as firmware/requirements.txt pins
DUPLEX_FEATURES = Feature.VOICE_ASSISTANT | Feature.API_AUDIO | Feature.SPEAKER
BARGE_IN_MODES = ("vad", "wake_word", "off")
DEFAULT_BARGE_IN = "wake_word"  # custom_components/rtvoice/const.py
PIPELINE_HELP = """\
Type a phrase and Enter to say it (Ctrl-D to quit); /sleep SECONDS, /quit."""
DUPLEX_HELP = """\
Type a phrase and Enter to say it, also while an answer plays (Ctrl-D to quit):
  TEXT             say it (the wake word first when the satellite is idle, and in
                   wake_word/off mode while an answer plays: that talks over it)
  /wake [TEXT]     the wake word, then TEXT
  /cough           250 ms of noise into the mic (vad mode: pauses, then resumes)
  /wait            until the answer has played;  /wait playing: until it plays
  /sleep SECONDS   /quit"""


class HassError(Exception):
    """Home Assistant refused a request."""


class Hass:
    """The REST and websocket API of a running Home Assistant."""

    def __init__(self, url: str, token: str, session: aiohttp.ClientSession) -> None:
        """Talk to ``url`` with ``token``."""
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._token = token
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def rest(self, method: str, path: str, json: Any = None) -> Any:
        """Call ``/api/<path>``; raise ``HassError`` unless it answers 2xx."""
        async with self._session.request(
            method, f"{self.url}/api/{path}", json=json, headers=self._headers
        ) as response:
            if response.status == 401:
                raise HassError(f"the token was refused (HTTP 401).\n{TOKEN_HELP}")
            if response.status >= 300:
                text = await response.text()
                raise HassError(f"{method} /api/{path}: HTTP {response.status} {text}")
            return await response.json()

    async def ws(self, kind: str, **data: Any) -> Any:
        """One websocket command; its result."""
        if self._ws is None:
            self._ws = await self._session.ws_connect(f"{self.url}/api/websocket")
            await self._ws.receive_json()  # auth_required
            await self._ws.send_json({"type": "auth", "access_token": self._token})
            answer = await self._ws.receive_json()
            if answer["type"] != "auth_ok":
                raise HassError(f"websocket: {answer}.\n{TOKEN_HELP}")
        message_id = next(self._ids)
        await self._ws.send_json({"id": message_id, "type": kind, **data})
        while True:
            answer = await self._ws.receive_json()
            if answer.get("id") == message_id and answer["type"] == "result":
                break
        if not answer["success"]:
            raise HassError(f"{kind}: {answer['error']}")
        return answer["result"]

    async def close(self) -> None:
        """Close the websocket."""
        if self._ws is not None:
            await self._ws.close()

    async def flow(
        self, handler: str, *steps: dict[str, Any], options: bool = False
    ) -> dict[str, Any]:
        """Run a config flow (``options``: an entry's options flow) through ``steps``.

        Stops early at its end; raises ``HassError`` when a step shows errors.
        """
        base = "config/config_entries/options/flow" if options else FLOW
        result = await self.rest("POST", base, {"handler": handler})
        for step in steps:
            if result["type"] not in ("form", "menu"):
                break
            if result.get("errors"):
                raise HassError(f"{handler} flow: {result['errors']}")
            result = await self.rest("POST", f"{base}/{result['flow_id']}", step)
        if result.get("errors"):
            raise HassError(f"{handler} flow: {result['errors']}")
        done: dict[str, Any] = result
        return done

    async def entries(self, domain: str) -> list[dict[str, Any]]:
        """Config entries of ``domain``."""
        entries: list[dict[str, Any]] = await self.rest(
            "GET", f"config/config_entries/entry?domain={domain}"
        )
        return entries

    async def entities(self) -> list[dict[str, Any]]:
        """Return the entity registry."""
        entities: list[dict[str, Any]] = await self.ws("config/entity_registry/list")
        return entities


async def ensure_wyoming(hass: Hass, title: str, port: int) -> str:
    """Return the entry id of Wyoming service ``title`` (added on ``port`` if missing)."""
    for entry in await hass.entries("wyoming"):
        if entry["title"] == title:
            if entry["state"] != "loaded":  # HA started while the server was down
                await hass.rest(
                    "POST", f"config/config_entries/entry/{entry['entry_id']}/reload"
                )
            return str(entry["entry_id"])
    result = await hass.flow("wyoming", {"host": "127.0.0.1", "port": port})
    if result["type"] != "create_entry":
        raise HassError(f"wyoming flow for {title}: {result}")
    return str(result["result"]["entry_id"])


async def ensure_agent(hass: Hass, agent: str | None) -> str:
    """Return the Realtime Voice agent entity (a new ha_agent-brain entry if none)."""
    if agent is not None:
        return agent
    ours = [
        e["entity_id"]
        for e in await hass.entities()
        if e["platform"] == RTVOICE and e["entity_id"].startswith("conversation.")
    ]
    if ours:
        return str(min(ours))
    result = await hass.flow(
        RTVOICE,
        {"next_step_id": "ha_agent"},
        {"name": "Realtime Voice", "agent_id": "conversation.home_assistant"},
    )
    if result["type"] != "create_entry":
        raise HassError(f"Realtime Voice flow: {result}")
    entry_id = result["result"]["entry_id"]
    for _ in range(50):  # the entity appears once the entry has set up
        for e in await hass.entities():
            if e["config_entry_id"] == entry_id and e["entity_id"].startswith(
                "conversation."
            ):
                return str(e["entity_id"])
        await asyncio.sleep(0.2)
    raise HassError("the Realtime Voice entry made no conversation entity")


async def ensure_esphome(hass: Hass, device: EmulatedDevice) -> str:
    """Add the emulated satellite (or point its entry at the new port); entry id."""
    result = await hass.flow("esphome", {"host": device.host, "port": device.port})
    if result["type"] == "create_entry":
        return str(result["result"]["entry_id"])
    if result.get("reason") != "already_configured":
        raise HassError(f"esphome flow: {result}")
    for entry in await hass.entries("esphome"):
        if entry["title"] == device.config.friendly_name:
            return str(entry["entry_id"])
    raise HassError("esphome says already configured, but the entry is not found")


def entity_of(
    entities: list[dict[str, Any]], entry_id: str, domain: str, suffix: str = ""
) -> str:
    """Return the ``domain`` entity an entry made (unique id ending in ``suffix``)."""
    for e in entities:
        if (
            e["config_entry_id"] == entry_id
            and e["entity_id"].startswith(f"{domain}.")
            and str(e["unique_id"]).endswith(suffix)
        ):
            return str(e["entity_id"])
    raise HassError(f"no {domain} entity for entry {entry_id}")


async def ensure_pipeline(hass: Hass, stt: str, tts: str, agent: str) -> str:
    """Create or update the pipeline; its id."""
    fields = {
        "name": PIPELINE_NAME,
        "language": "en",
        "conversation_engine": agent,
        "conversation_language": "en",
        "stt_engine": stt,
        "stt_language": "en",
        "tts_engine": tts,
        "tts_language": "en",
        "tts_voice": None,
        "wake_word_entity": None,
        "wake_word_id": None,
    }
    listing = await hass.ws("assist_pipeline/pipeline/list")
    for pipeline in listing["pipelines"]:
        if pipeline["name"] == PIPELINE_NAME:
            await hass.ws(
                "assist_pipeline/pipeline/update",
                pipeline_id=pipeline["id"],
                **fields,
            )
            return str(pipeline["id"])
    created = await hass.ws("assist_pipeline/pipeline/create", **fields)
    return str(created["id"])


async def ensure_reachable_url(hass: Hass) -> str | None:
    """Make HA's internal URL one the satellite can fetch answers from.

    A satellite fetches TTS from HA's internal URL (by default the machine's network
    address). ``scripts/develop`` listens on 127.0.0.1 unless ``RTVOICE_DEV_HOST`` says
    otherwise; then that address is unreachable and the internal URL is set to the one
    this script uses. Returns a note on what was changed, if anything.
    """
    urls = await hass.ws("network/url")
    internal = urls.get("internal")
    if internal:
        url = URL(internal)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(url.host, url.port), 3
            )
        except (OSError, TimeoutError):
            pass
        else:
            writer.close()
            return None
    await hass.ws("config/core/update", internal_url=hass.url)
    return (
        f"HA's internal URL {internal} is not reachable (HA listens on 127.0.0.1):"
        f" changed it to {hass.url} so the satellite can fetch answers"
        " (Settings > System > Network shows it)"
    )


@dataclass
class Setup:
    """What was added to Home Assistant."""

    agent: str
    stt: str
    tts: str
    satellite: str
    device_url: str
    note: str | None


async def set_up(
    hass: Hass,
    device: EmulatedDevice,
    stt_port: int,
    tts_port: int,
    agent: str | None,
) -> Setup:
    """Add (or reuse) everything; wait until HA owns the satellite's voice assistant."""
    note = await ensure_reachable_url(hass)
    stt_entry = await ensure_wyoming(hass, STT_PROGRAM, stt_port)
    tts_entry = await ensure_wyoming(hass, TTS_PROGRAM, tts_port)
    agent_entity = await ensure_agent(hass, agent)
    released = await release_esphome(hass, device, duplex=False)
    note = "; ".join(n for n in (note, released) if n) or None
    esphome_entry = await ensure_esphome(hass, device)
    await asyncio.wait_for(device.wait_for_voice_client(), 30)
    entities: list[dict[str, Any]] = []
    for _ in range(50):  # entity registration follows the connection closely
        entities = await hass.entities()
        try:
            stt = entity_of(entities, stt_entry, "stt")
            tts = entity_of(entities, tts_entry, "tts")
            satellite = entity_of(entities, esphome_entry, "assist_satellite")
            select = entity_of(entities, esphome_entry, "select", "-pipeline")
            break
        except HassError:
            await asyncio.sleep(0.2)
    else:
        raise HassError("HA made no stt/tts/satellite entities")
    await ensure_pipeline(hass, stt, tts, agent_entity)
    await hass.rest(
        "POST",
        "services/select/select_option",
        {"entity_id": select, "option": PIPELINE_NAME},
    )
    devices = await hass.ws("config/device_registry/list")
    [device_id] = [d["id"] for d in devices if esphome_entry in d["config_entries"]]
    return Setup(
        agent_entity,
        stt,
        tts,
        satellite,
        f"{hass.url}/config/devices/device/{device_id}",
        note,
    )


# --------------------------------------------------------------------------- duplex


@dataclass
class DuplexSetup:
    """What duplex mode added to Home Assistant."""

    agent: str
    entry_id: str
    satellite: str
    barge_in: str
    notes: list[str]
    restore_preferred: str | None  # the preferred pipeline to restore at exit


async def wait_for_entities(
    hass: Hass, wanted: dict[str, tuple[str, str, str]]
) -> dict[str, str]:
    """Entity ids by name once each (entry id, domain, unique id suffix) exists."""
    for _ in range(50):  # registration follows a setup closely
        entities = await hass.entities()
        try:
            return {name: entity_of(entities, *where) for name, where in wanted.items()}
        except HassError:
            await asyncio.sleep(0.2)
    raise HassError(f"HA made no {', '.join(wanted)} entities")


async def entry_of(hass: Hass, entity_id: str) -> str:
    """Return the config entry id of ``entity_id``."""
    for e in await hass.entities():
        if e["entity_id"] == entity_id and e["config_entry_id"]:
            return str(e["config_entry_id"])
    raise HassError(f"{entity_id} belongs to no config entry")


async def release_esphome(
    hass: Hass, device: EmulatedDevice, *, duplex: bool
) -> str | None:
    """Let exactly one integration own the device's voice assistant.

    Duplex: HA's ``esphome`` entry for the same device (an earlier pipeline-mode run)
    must not own it: its satellite entity is disabled. Pipeline mode: enabled again
    (and the entry reloaded). Returns a note when something changed.
    """
    names = {device.config.friendly_name, device.config.name}
    entries = [e for e in await hass.entries("esphome") if e["title"] in names]
    for entry in entries:
        for e in await hass.entities():
            if e["config_entry_id"] != entry["entry_id"] or not e[
                "entity_id"
            ].startswith("assist_satellite."):
                continue
            if duplex and e["disabled_by"] is None:
                await hass.ws(
                    "config/entity_registry/update",
                    entity_id=e["entity_id"],
                    disabled_by="user",
                )
                return (
                    f"disabled {e['entity_id']} of HA's esphome integration: in"
                    " duplex mode Realtime Voice owns the voice assistant"
                )
            if not duplex and e["disabled_by"] == "user":
                await hass.ws(
                    "config/entity_registry/update",
                    entity_id=e["entity_id"],
                    disabled_by=None,
                )
                await hass.rest(
                    "POST", f"config/config_entries/entry/{entry['entry_id']}/reload"
                )
                return f"enabled {e['entity_id']} again (pipeline mode)"
    return None


def _form_fields(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in result.get("data_schema") or []}


async def _esphome_subentry(hass: Hass, entry_id: str, key: str) -> str | None:
    """Return the subentry id of the entry's ESPHome satellite ``key`` (its MAC)."""
    subentries = await hass.ws("config_entries/subentries/list", entry_id=entry_id)
    for subentry in subentries:
        if (
            subentry["subentry_type"] == ESPHOME_SATELLITE
            and subentry["unique_id"] == key
        ):
            return str(subentry["subentry_id"])
    return None


async def _satellite_form(
    hass: Hass, entry_id: str, subentry_id: str | None
) -> dict[str, Any]:
    """Press "Add ESPHome satellite" (or "Reconfigure" on ``subentry_id``): its form."""
    start: dict[str, Any] = {"handler": [entry_id, ESPHOME_SATELLITE]}
    if subentry_id is not None:
        start["subentry_id"] = subentry_id
    result = await hass.rest("POST", SUBENTRY_FLOW, start)
    if result["type"] == "menu":  # HA's esphome has satellites to take over
        result = await hass.rest(
            "POST", f"{SUBENTRY_FLOW}/{result['flow_id']}", {"next_step_id": "connect"}
        )
    if result["type"] != "form":
        raise HassError(f"the satellite's form did not open: {result}")
    return dict(result)


async def add_duplex(
    hass: Hass, entry_id: str, device: EmulatedDevice, barge_in: str | None
) -> bool:
    """Add the device to the entry as an ESPHome satellite, as a user does.

    "Add ESPHome satellite" on the entry's page (a subentry flow); a satellite
    with the same MAC is reconfigured with the new address instead (a re-run
    reuses it). Returns whether ``barge_in`` was stored on the way (a form
    offering a ``barge_in`` field).
    """
    key = device.config.mac_address.lower()
    subentry_id = await _esphome_subentry(hass, entry_id, key)
    form = await _satellite_form(hass, entry_id, subentry_id)
    user_input = {
        name: value
        for name, field in _form_fields(form).items()
        if (value := _shown(field)) is not None
    }
    user_input.update({"host": device.host, "port": device.port})
    if device.noise_psk:
        user_input["noise_psk"] = device.noise_psk
    stored = False
    if barge_in is not None and "barge_in" in _form_fields(form):
        user_input["barge_in"] = barge_in
        stored = True
    result = await hass.rest("POST", f"{SUBENTRY_FLOW}/{form['flow_id']}", user_input)
    if result["type"] != "create_entry" and result.get("reason") != (
        "reconfigure_successful"
    ):
        raise HassError(
            f"adding the duplex satellite: {result.get('errors') or result}"
        )
    return stored


async def store_barge_in(hass: Hass, entry_id: str, key: str, mode: str) -> bool:
    """Store the satellite's barge-in mode through its reconfigure form.

    False when the form offers none.
    """
    return await _barge_in_form(hass, entry_id, key, mode) is not None


async def stored_barge_in(hass: Hass, entry_id: str, key: str) -> str | None:
    """Read the satellite's stored barge-in mode from its reconfigure form (not saved)."""
    return await _barge_in_form(hass, entry_id, key, None)


async def _barge_in_form(
    hass: Hass, entry_id: str, key: str, mode: str | None
) -> str | None:
    """Open the satellite's reconfigure form; store ``mode`` or read the shown one.

    With ``mode`` the form is submitted (everything else as shown) and ``mode``
    returned; without, the form is abandoned and the value it shows returned.
    None: no such satellite, or no ``barge_in`` field.
    """
    subentry_id = await _esphome_subentry(hass, entry_id, key)
    if subentry_id is None:
        return None
    form = await _satellite_form(hass, entry_id, subentry_id)
    fields = _form_fields(form)
    if "barge_in" not in fields:
        await hass.rest("DELETE", f"{SUBENTRY_FLOW}/{form['flow_id']}")
        return None
    if mode is None:
        await hass.rest("DELETE", f"{SUBENTRY_FLOW}/{form['flow_id']}")
        return _shown_value(fields["barge_in"])
    user_input = {
        name: value
        for name, field in fields.items()
        if (value := _shown(field)) is not None
    }
    user_input["barge_in"] = mode
    result = await hass.rest("POST", f"{SUBENTRY_FLOW}/{form['flow_id']}", user_input)
    return mode if result.get("reason") == "reconfigure_successful" else None


def _shown(field: dict[str, Any]) -> Any:
    """Return what a form field shows, as the frontend would send it back."""
    suggested = (field.get("description") or {}).get("suggested_value")
    return suggested if suggested is not None else field.get("default")


def _shown_value(field: dict[str, Any]) -> str | None:
    """Return the value a form field shows, as text (None: nothing shown)."""
    value = _shown(field)
    return None if value is None else str(value)


async def use_pipeline(
    hass: Hass, device_id: str | None, pipeline_id: str
) -> tuple[str | None, str]:
    """Make the duplex satellite use the Virtual satellite pipeline.

    Through a select of its device offering the pipeline when there is one; else
    the duplex satellite follows the preferred pipeline, which is switched (and
    switched back at exit). Returns (pipeline to restore, note).
    """
    if device_id is not None:
        # Realtime Voice's own select first: HA's esphome one on the same device
        # does not apply to duplex mode.
        selects = sorted(
            (
                e
                for e in await hass.entities()
                if e["device_id"] == device_id and e["entity_id"].startswith("select.")
            ),
            key=lambda e: e.get("platform") != RTVOICE,
        )
        for e in selects:
            state = await hass.rest("GET", f"states/{e['entity_id']}")
            if PIPELINE_NAME in state["attributes"].get("options", []):
                await hass.rest(
                    "POST",
                    "services/select/select_option",
                    {"entity_id": e["entity_id"], "option": PIPELINE_NAME},
                )
                return None, f"{e['entity_id']} set to {PIPELINE_NAME!r}"
    listing = await hass.ws("assist_pipeline/pipeline/list")
    preferred = listing.get("preferred_pipeline")
    if preferred == pipeline_id:
        return None, f"{PIPELINE_NAME!r} is the preferred pipeline"
    await hass.ws("assist_pipeline/pipeline/set_preferred", pipeline_id=pipeline_id)
    return preferred, (
        f"duplex satellites use the preferred Assist pipeline's STT and TTS:"
        f" {PIPELINE_NAME!r} is preferred while this runs (restored at exit)"
    )


async def set_up_duplex(
    hass: Hass,
    device: EmulatedDevice,
    *,
    stt_port: int,
    tts_port: int,
    agent: str | None,
    barge_in: str | None,
) -> DuplexSetup:
    """Add (or reuse) the speech services, the agent's entry and the duplex satellite."""
    notes: list[str] = []
    stt_entry = await ensure_wyoming(hass, STT_PROGRAM, stt_port)
    tts_entry = await ensure_wyoming(hass, TTS_PROGRAM, tts_port)
    agent_entity = await ensure_agent(hass, agent)
    entry_id = await entry_of(hass, agent_entity)
    found = await wait_for_entities(
        hass, {"stt": (stt_entry, "stt", ""), "tts": (tts_entry, "tts", "")}
    )
    pipeline_id = await ensure_pipeline(hass, found["stt"], found["tts"], agent_entity)
    if note := await release_esphome(hass, device, duplex=True):
        notes.append(note)
    stored = await add_duplex(hass, entry_id, device, barge_in)
    key = device.config.mac_address.lower()
    await asyncio.wait_for(device.wait_for_voice_client(), 60)  # the entry reloaded
    [satellite] = (
        await wait_for_entities(
            hass, {"satellite": (entry_id, "assist_satellite", f"-duplex-{key}")}
        )
    ).values()
    if barge_in is not None and not stored:
        since = device.mark()
        stored = await store_barge_in(hass, entry_id, key, barge_in)
        if stored:  # the entry reloads with the setting: wait for the new link
            await asyncio.wait_for(device.wait_for_voice_client(since), 60)
        else:
            notes.append(
                f"this Home Assistant offers no barge-in setting for duplex"
                f" satellites yet: --barge-in {barge_in} is not stored; the"
                f" satellite uses the default ({DEFAULT_BARGE_IN})"
            )
    if barge_in is not None and stored:
        mode = barge_in
    elif (shown := await stored_barge_in(hass, entry_id, key)) is not None:
        mode = shown  # what is stored, e.g. by an earlier run
    else:
        mode = DEFAULT_BARGE_IN
        notes.append(
            f"barge-in: the stored mode is assumed to be the default ({mode});"
            " --barge-in sets it"
        )
    device_id = next(
        (e["device_id"] for e in await hass.entities() if e["entity_id"] == satellite),
        None,
    )
    restore, note = await use_pipeline(hass, device_id, pipeline_id)
    notes.append(note)
    return DuplexSetup(agent_entity, entry_id, satellite, mode, notes, restore)


async def main_duplex(args: argparse.Namespace, token: str) -> int:
    """Duplex mode: Realtime Voice owns the satellite; talk over its answers."""
    spoken = [line for line in args.say if not line.strip().startswith("/")]
    phrases = list(dict.fromkeys([*DEFAULT_PHRASES, *args.phrase, *spoken]))
    echo: dict[str, Any] = {}
    if args.echo:
        echo = {"echo_gain": args.echo_gain, "echo_delay_ms": args.echo_delay}
    async with (
        aiohttp.ClientSession() as session,
        WyomingSttServer(phrases, port=args.stt_port) as stt_server,
        WyomingTtsServer(port=args.tts_port) as tts_server,
        EmulatedDevice(
            **DEVICE_IDENTITY,
            esphome_version=DUPLEX_FIRMWARE,
            # A voice assistant with a speaker plays raw API audio (the project's
            # duplex firmware); one with a media player would be sent a stream.
            features=DUPLEX_FEATURES,
            **echo,
        ) as device,
    ):
        hass = Hass(args.url, token, session)
        try:
            setup = await set_up_duplex(
                hass,
                device,
                stt_port=stt_server.port,
                tts_port=tts_server.port,
                agent=args.agent,
                barge_in=args.barge_in,
            )
        except (HassError, aiohttp.ClientError, TimeoutError) as err:
            await hass.close()
            print(f"error: {err}", file=sys.stderr)
            return 1
        try:
            for note in setup.notes:
                print(f"note: {note}")
            echoes = (
                f", echo {args.echo_gain:g}x after {args.echo_delay} ms"
                if args.echo
                else ""
            )
            print(
                f"Duplex satellite {setup.satellite} (Realtime Voice entry of"
                f" {setup.agent}) is connected to {hass.url}\n"
                f"  barge-in mode {setup.barge_in}{echoes}; STT/TTS of"
                f" {PIPELINE_NAME!r}"
            )
            return await converse(args, device, stt_server, tts_server, setup)
        finally:
            if setup.restore_preferred is not None:
                with contextlib.suppress(HassError, aiohttp.ClientError):
                    await hass.ws(
                        "assist_pipeline/pipeline/set_preferred",
                        pipeline_id=setup.restore_preferred,
                    )
            await hass.close()


async def converse(
    args: argparse.Namespace,
    device: EmulatedDevice,
    stt_server: WyomingSttServer,
    tts_server: WyomingTtsServer,
    setup: DuplexSetup,
) -> int:
    """Run the --say commands (then wait), or the typed ones."""
    async with DuplexConsole(
        device, stt_server, tts_server, barge_in=setup.barge_in, wav=Path(args.wav)
    ) as console:
        if args.say:
            for line in args.say:
                if not await console.command(line):
                    break
            else:
                await console.wait()
            print(f"  answer audio of the last answer: {args.wav}")
            return 0 if console.answers_heard else 1
        print(DUPLEX_HELP)
        while True:
            try:
                line = await asyncio.to_thread(input, "")
            except EOFError:
                return 0
            if not await console.command(line):
                return 0


def write_wav(path: Path, device: EmulatedDevice) -> float | None:
    """Write the last answer the speaker played to ``path``; its seconds."""
    if not device.playbacks:
        return None
    playback = device.playbacks[-1]
    if playback.format is not None and playback.format.codec == "wav":
        path.write_bytes(bytes(playback.data))
        try:
            with wave.open(str(path), "rb") as wav:
                return wav.getnframes() / wav.getframerate()
        except (wave.Error, EOFError):
            return None
    rate = (playback.format.sample_rate if playback.format else 0) or 16000
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(playback.pcm)
    return len(playback.pcm) / 2 / rate


def _ms(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start) * 1e3:.0f} ms"


async def say(
    device: EmulatedDevice, stt_server: WyomingSttServer, text: str, wav: Path
) -> bool:
    """Say ``text`` through the satellite; print what happened. True when answered."""
    if text not in stt_server.phrases:
        await stt_server.set_phrases([*stt_server.phrases, text])
    pcm = await asyncio.to_thread(speak, text)
    played = len(device.playbacks)
    run = device.say(pcm)
    if run is None:
        print("  the satellite is busy (a run is going); try again")
        return False
    try:
        await asyncio.wait_for(run.ended.wait(), RUN_TIMEOUT)
    except TimeoutError:
        print(f"  no end of the run within {RUN_TIMEOUT:.0f} s")
        return False
    return report(device, run, played, wav)


def report(device: EmulatedDevice, run: Run, played: int, wav: Path) -> bool:
    """Print what the satellite heard for ``run``."""
    events = {e.detail["type"]: e for e in run.events}

    def text(kind: EventType) -> str | None:
        entry = events.get(kind)
        return None if entry is None else entry.detail["data"].get("text")

    if EventType.ERROR in events:
        data = events[EventType.ERROR].detail["data"]
        print(f"  error: {data.get('code')}: {data.get('message')}")
    print(f"  recognised: {text(EventType.STT_END)!r}")
    print(f"  answer:     {text(EventType.TTS_START)!r}")
    end = run.last_speech_frame_at
    playback = device.playbacks[-1] if len(device.playbacks) > played else None

    def at(kind: EventType) -> float | None:
        entry = events.get(kind)
        return None if entry is None else entry.at

    first = None if playback is None else playback.first_byte_at
    last = None if playback is None else playback.last_byte_at
    print(
        "  timings from the end of the spoken clip:"
        f" end of speech detected {_ms(end, at(EventType.STT_VAD_END))},"
        f" recognised {_ms(end, at(EventType.STT_END))},"
        f" answered {_ms(end, at(EventType.INTENT_END))},"
        f" audio ready {_ms(end, at(EventType.TTS_END))},"
        f" first audio byte {_ms(end, first)},"
        f" last audio byte {_ms(end, last)}"
    )
    if playback is None or playback.first_byte_at is None:
        why = "none" if playback is None else f"{playback.url}: {playback.error}"
        print(f"  no answer audio ({why})")
        return False
    seconds = write_wav(wav, device)
    print(f"  answer audio: {wav} ({seconds or 0:.1f} s)")
    return True


async def main(args: argparse.Namespace) -> int:
    """Set up, say, report."""
    token = args.token or os.environ.get("HASS_TOKEN")
    if not token:
        print(f"error: no token.\n{TOKEN_HELP}", file=sys.stderr)
        return 2
    if args.duplex:
        return await main_duplex(args, token)
    phrases = list(dict.fromkeys([*DEFAULT_PHRASES, *args.phrase, *args.say]))
    async with (
        aiohttp.ClientSession() as session,
        WyomingSttServer(phrases, port=args.stt_port, record=False) as stt_server,
        WyomingTtsServer(port=args.tts_port, record=False),
        EmulatedDevice(**DEVICE_IDENTITY) as device,
    ):
        hass = Hass(args.url, token, session)
        try:
            setup = await set_up(hass, device, args.stt_port, args.tts_port, args.agent)
        except (HassError, aiohttp.ClientError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        finally:
            await hass.close()
        if setup.note:
            print(f"note: {setup.note}")
        print(
            f"Virtual satellite {setup.satellite} is connected to {hass.url}\n"
            f"  pipeline {PIPELINE_NAME!r}: {setup.stt} -> {setup.agent} -> {setup.tts}\n"
            f"  device page (live state, like a real satellite): {setup.device_url}"
        )
        wav = Path(args.wav)
        ok = True
        for text in args.say:
            print(f"> {text}")
            answered = await pipeline_command(device, stt_server, text, wav)
            if answered is None:
                break
            ok = answered and ok
        if args.say:
            return 0 if ok else 1
        print(PIPELINE_HELP)
        while True:
            try:
                line = await asyncio.to_thread(input, "say> ")
            except EOFError:
                return 0
            if await pipeline_command(device, stt_server, line, wav) is None:
                return 0


async def pipeline_command(
    device: EmulatedDevice, stt_server: WyomingSttServer, line: str, wav: Path
) -> bool | None:
    """Run one line in pipeline mode: say it, or a command; None for ``/quit``."""
    line = line.strip()
    word, _, rest = line.partition(" ")
    if not line:
        return True
    if word == "/quit":
        return None
    if word == "/sleep":
        try:
            seconds = float(rest or 1)
        except ValueError:
            print(f"  /sleep takes seconds, not {rest!r}")
            return False
        await asyncio.sleep(seconds)
        return True
    if word.startswith("/"):
        print(f"  unknown command {word} in pipeline mode (/sleep SECONDS, /quit)")
        return False
    return await say(device, stt_server, line, wav)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line (``argv``, default: the process's)."""
    parser = argparse.ArgumentParser(
        prog="scripts/satellite",
        description=__doc__,
        epilog=TOKEN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:8123",
        help="Home Assistant (scripts/develop)",
    )
    parser.add_argument("--token", help="long-lived access token (or HASS_TOKEN)")
    parser.add_argument(
        "--say",
        action="append",
        default=[],
        metavar="TEXT",
        help="say TEXT and exit (repeatable); without it, phrases are read at a prompt",
    )
    parser.add_argument(
        "--phrase",
        action="append",
        default=[],
        metavar="TEXT",
        help="another phrase the speech recogniser should know (repeatable)",
    )
    parser.add_argument(
        "--wav",
        default=str(Path(tempfile.gettempdir()) / "rtvoice-satellite-answer.wav"),
        help="where the answer audio goes (default: in the temporary folder)",
    )
    parser.add_argument(
        "--agent",
        help="conversation entity of the pipeline (default: the first Realtime Voice"
        " agent, created with HA's built-in agent as its brain when there is none)",
    )
    parser.add_argument("--stt-port", type=int, default=10300)
    parser.add_argument("--tts-port", type=int, default=10200)
    duplex = parser.add_argument_group(
        "duplex mode",
        "Realtime Voice owns the satellite (no esphome entry, no pipeline run): the"
        " mic streams for the whole conversation and you can talk over an answer."
        " Lines may be commands (/wake, /cough, /wait, /sleep, /quit), in --say too.",
    )
    duplex.add_argument(
        "--duplex",
        action="store_true",
        help="add the satellite to the Realtime Voice entry of the agent as an"
        " ESPHome satellite (Add ESPHome satellite, as a user does; reused on"
        " re-runs)",
    )
    duplex.add_argument(
        "--barge-in",
        choices=BARGE_IN_MODES,
        help="store this barge-in mode for the satellite, where its settings"
        " offer it (otherwise a note says it was not stored and the stored mode"
        " applies, by default wake_word)",
    )
    duplex.add_argument(
        "--echo",
        action="store_true",
        help="the satellite's mic also hears its own speaker (echo)",
    )
    duplex.add_argument(
        "--echo-gain", type=float, default=0.5, help="echo level (default 0.5)"
    )
    duplex.add_argument(
        "--echo-delay",
        type=int,
        default=120,
        metavar="MS",
        help="speaker-to-mic delay of the echo (default 120 ms)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
