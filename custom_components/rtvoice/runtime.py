"""What one config entry runs, and the one place where it is wired together.

The runtime builds the brain, the registries, the kernel, the satellite directory,
the session manager and the control plane, and hands each what it needs: data and
calls flow one way (entity / actions → sessions / control → kernel → output sink).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
import functools
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant

from .brain import Brain, async_create_brain
from .const import (
    BRAIN_OPENAI,
    CONF_LLM_HASS_API,
    DEFAULT_LLM_HASS_API,
    LLM_API_NONE,
    PARENT_ID,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from .control import ControlPlane
from .duplex_ha import DuplexSatellites, satellite_key
from .duplex_link import RoundEnds
from .kernel import ChannelRegistry, Kernel, PromptRegistry, ToolRunner
from .satellites.directory import SatelliteDirectory
from .satellites.stored import satellite_confs
from .sessions import SessionManager
from .wyoming_ha import WyomingSatellites, wyoming_key


@dataclass
class RtVoiceRuntime:
    """Stored in ``entry.runtime_data``."""

    brain: Brain
    kernel: Kernel
    channels: ChannelRegistry
    prompts: PromptRegistry
    tools: ToolRunner | None
    satellites: SatelliteDirectory
    sessions: SessionManager
    control: ControlPlane
    duplex: DuplexSatellites
    wyoming: WyomingSatellites

    def apply(self, entry: ConfigEntry) -> bool:
        """Apply a changed entry without a reload; False when a reload is needed.

        The options apply in place (running conversations and the transcript
        archive stay; the entry's conversation settings reach the duplex
        satellites' next conversations too) except switching tools on or off:
        whether the model is offered tools at all (and ``ask_parent``) is wired
        into the kernel and the conversation entity when the entry loads. A
        satellite added, changed or removed (a subentry) needs a reload too: its
        link and entities are set up when the entry loads.
        """
        if _by_key(satellite_confs(entry, SUBENTRY_ESPHOME), satellite_key) != (
            _by_key(self.duplex.configs.values(), satellite_key)
        ) or _by_key(satellite_confs(entry, SUBENTRY_WYOMING), wyoming_key) != (
            _by_key(self.wyoming.configs.values(), wyoming_key)
        ):
            return False
        options = entry.options
        if self.brain.kind == BRAIN_OPENAI:
            api_id = options.get(CONF_LLM_HASS_API, DEFAULT_LLM_HASS_API)
            wants_tools = bool(api_id) and api_id != LLM_API_NONE
            if wants_tools != (self.tools is not None):
                return False
        self.brain.configure(options)
        self.sessions.configure(options)
        # Duplex satellites' conversations opened from now on follow them too.
        self.duplex.configure()
        self.wyoming.configure()
        return True

    async def async_shutdown(self) -> None:
        """Close every conversation (hand-off included) and stop listening.

        Safe to call twice (HA stopping, then the entry unloading).
        """
        # The satellites first: their conversations close their own children
        # (hand-off included) before the sessions close every other child.
        await asyncio.gather(self.wyoming.async_stop(), self.duplex.async_stop())
        await self.control.async_shutdown()
        await self.sessions.async_shutdown()
        self.satellites.async_stop()


def _by_key(
    confs: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]
) -> dict[str, dict[str, Any]]:
    return {key(conf): dict(conf) for conf in confs}


def _text_paused(
    round_ends: RoundEnds, sessions: SessionManager, child_id: str, seq: int
) -> None:
    """Kernel(on_text_pause=...): to the duplex conversation or the Assist turn."""
    round_ends.paused(child_id, seq)
    sessions.on_text_pause(child_id, seq)


type RtVoiceConfigEntry = ConfigEntry[RtVoiceRuntime]


async def async_build_runtime(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> RtVoiceRuntime:
    """Create and wire everything an entry runs.

    Raises ConfigEntryNotReady / ConfigEntryAuthFailed when the brain cannot be used.
    """
    channels = ChannelRegistry()
    prompts = PromptRegistry()
    brain = await async_create_brain(hass, entry, prompts)
    satellites = SatelliteDirectory(hass, entry, prompts)
    sessions = SessionManager(hass, entry, brain, channels, satellites)
    round_ends = RoundEnds()  # duplex conversations learn their rounds' ends
    kernel = Kernel(
        brain.provider,
        channels,
        tools=brain.tools,
        prompts=prompts,
        parent_id=PARENT_ID,
        on_closed=sessions.on_closed,
        # ask_parent is a tool: with tools off ("none") the model gets no tools
        # at all, so chat-only models keep working.
        on_ask_parent=sessions.on_ask_parent if brain.tools is not None else None,
        on_state=sessions.on_state,
        on_tool_result=sessions.on_tool_result,
        on_round_end=round_ends,
        on_text_pause=functools.partial(_text_paused, round_ends, sessions),
    )
    sessions.start(kernel)
    await satellites.async_start()
    duplex = DuplexSatellites(
        hass,
        entry.entry_id,
        kernel,
        round_ends,
        satellite_confs(entry, SUBENTRY_ESPHOME),
        sessions=sessions,
    )
    await duplex.async_start()
    wyoming = WyomingSatellites(
        hass,
        entry.entry_id,
        kernel,
        round_ends,
        satellite_confs(entry, SUBENTRY_WYOMING),
        sessions=sessions,
    )
    try:
        await wyoming.async_start()
    except BaseException:
        await duplex.async_stop()
        raise
    return RtVoiceRuntime(
        brain=brain,
        kernel=kernel,
        channels=channels,
        prompts=prompts,
        tools=brain.tools,
        satellites=satellites,
        sessions=sessions,
        control=ControlPlane(hass, entry, kernel, sessions, satellites, duplex=duplex),
        duplex=duplex,
        wyoming=wyoming,
    )
