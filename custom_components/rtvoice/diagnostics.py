"""Diagnostics of a Realtime Voice entry: configuration, structure and counters.

What users may safely attach to an issue. Never included: the API key, the prompt
and satellites' encryption keys (redacted), credentials or query strings of the
base URL, and any text that went through a conversation — transcripts, prompt
section contents and tool results are reduced to counts and names. The duplex
ESPHome and Wyoming satellites' links report their connection, session state and
counters (their host and port are in the entry's subentries, listed too).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant

from .const import CONF_API_KEY, CONF_BASE_URL, CONF_NOISE_PSK, CONF_PROMPT
from .kernel import Capability
from .redact import safe_url
from .runtime import RtVoiceConfigEntry, RtVoiceRuntime

if TYPE_CHECKING:
    from .duplex import DuplexSession
    from .duplex_link import DuplexConversation
    from .esphome_link import EsphomeLink
    from .wyoming_link import WyomingSatelliteLink

TO_REDACT: Final = {CONF_API_KEY, CONF_NOISE_PSK, CONF_PROMPT}


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> dict[str, Any]:
    """Return the diagnostics of an entry (redacted, without conversation text)."""
    data = dict(entry.data)
    if isinstance(base_url := data.get(CONF_BASE_URL), str):
        data[CONF_BASE_URL] = safe_url(base_url)
    diagnostics: dict[str, Any] = {
        "entry": {
            "title": entry.title,
            "state": entry.state.value,
            "data": data,
            "options": dict(entry.options),
            "subentries": [
                {
                    "type": subentry.subentry_type,
                    "title": subentry.title,
                    "data": dict(subentry.data),
                }
                for subentry in entry.subentries.values()
            ],
        }
    }
    if entry.state is ConfigEntryState.LOADED:
        diagnostics["runtime"] = _runtime(entry.runtime_data)
    return async_redact_data(diagnostics, TO_REDACT)


def _runtime(runtime: RtVoiceRuntime) -> dict[str, Any]:
    """Structure and counters of a loaded entry."""
    kernel = runtime.kernel
    satellites = []
    for entity_id in runtime.satellites.satellites():
        if (info := runtime.satellites.info(entity_id)) is None:
            continue  # pragma: no cover - listed satellites have info
        satellites.append(
            {
                "entity_id": info.entity_id,
                "area": info.area,
                "floor": info.floor,
                "language": info.language,
                "features": list(info.features),
            }
        )
    return {
        "tools": runtime.tools is not None,
        "satellites": satellites,
        "duplex_satellites": [
            _esphome_link(key, link)
            for key, link in sorted(runtime.duplex.links.items())
        ],
        "wyoming_satellites": [
            _wyoming_link(key, link, key in runtime.wyoming.conflicts)
            for key, link in sorted(runtime.wyoming.links.items())
        ],
        # id, satellite, device, state and counters; no text.
        "conversations": runtime.control.list_conversations(),
        "archived_conversations": [
            {"id": child_id, "messages": len(kernel.transcript(child_id) or ())}
            for child_id in sorted(kernel.archived())
        ],
        "channels": [
            {
                "name": channel.name,
                "kind": channel.kind,
                "capabilities": [
                    flag.name for flag in Capability if flag in channel.capabilities
                ],
                "owner": channel.owner,
            }
            for channel in sorted(runtime.channels.list(), key=lambda c: c.name)
        ],
        # Names and sizes only: section texts name people, rooms and devices.
        "prompt_sections": [
            {
                "section": section.section,
                "owner": section.owner,
                "order": section.order,
                "scope": section.scope,
                "volatile": section.volatile,
                "chars": len(section.content),
            }
            for section in runtime.prompts.snapshot()
        ],
    }


def _esphome_link(key: str, link: EsphomeLink) -> dict[str, Any]:
    """Describe a duplex link: connection, firmware, answer output, conversation."""
    info = link.device_info
    return {
        "key": key,
        "available": link.available,
        "esphome_version": info.esphome_version if info is not None else None,
        "login": link.login,
        "answer_output": "media_player"
        if link.media_player_key is not None
        else "api_audio",
        # The error's type only: messages may carry addresses or key material.
        "last_error": type(link.last_error).__name__ if link.last_error else None,
        "mic_oversized_messages": link.mic_stats.oversized,
        "mic_odd_messages": link.mic_stats.odd,
        "dsp_dropped": link.dsp_dropped,
        "conversation": _conversation(link.conversation),
    }


def _wyoming_link(
    key: str, link: WyomingSatelliteLink, conflict: bool
) -> dict[str, Any]:
    """Describe a Wyoming link: connection, counters, conversation."""
    stats = asdict(link.stats)
    # Per-stream times are for benchmarks: counts only.
    for name in ("stream_last_frame_at", "stream_first_frame_at"):
        stats[name] = len(stats[name])
    stats.pop("last_frame_sent_at", None)
    satellite = link.info.satellite if link.info is not None else None
    return {
        "key": key,
        "state": link.state.value,
        "connected": link.connected,
        "held_by_wyoming_integration": conflict,
        "satellite_version": satellite.version if satellite is not None else None,
        "stats": stats,
        "dsp_dropped": link.dsp_dropped,
        "conversation": _conversation(link.conversation),
    }


def _conversation(conversation: DuplexConversation | None) -> dict[str, Any] | None:
    """Describe a conversation: child, sessions, the session's counters (no text)."""
    if conversation is None:
        return None
    return {
        "child_id": conversation.child_id,
        "sessions": conversation.sessions,
        "idle": conversation.idle,
        "closing": conversation.closing,
        "session": _session(conversation.session),
    }


def _session(session: DuplexSession) -> dict[str, Any]:
    stats = session.stats
    return {
        "state": session.state.value,
        "utterances": stats.utterances,
        "pushes": stats.pushes,
        "barge_ins": stats.barge_ins,
        "pauses": stats.pauses,
        "false_barge_ins": stats.false_barge_ins,
        "wake_interrupts": stats.wake_interrupts,
        "dropped_utterances": stats.dropped_utterances,
        "echo_utterances": stats.echo_utterances,
        "room_utterances": stats.room_utterances,
        "room_level_dbfs": session.gate.room.level,
        "stt_errors": stats.stt_errors,
        "stt_dropped": stats.stt_dropped,
        "tts_errors": stats.tts_errors,
        "early_transcripts": stats.early_transcripts,
        "early_ends": stats.early_ends,
        "speculations": stats.speculations,
        "confirmed_speculations": stats.confirmed_speculations,
        "preempted": stats.preempted,
        "spoken_over_ends": stats.spoken_over_ends,
    }
