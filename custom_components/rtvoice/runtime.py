"""What one config entry runs, and the one place where it is wired together.

The runtime builds the brain, the registries, the kernel, the satellite directory,
the session manager and the control plane, and hands each what it needs: data and
calls flow one way (entity / actions → sessions / control → kernel → output sink).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
import functools
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant

from .brain import Brain, async_create_brain
from .const import (
    BRAIN_OPENAI,
    CONF_DUPLEX_SATELLITES,
    CONF_LLM_HASS_API,
    CONF_WYOMING_SATELLITES,
    DEFAULT_LLM_HASS_API,
    LLM_API_NONE,
    PARENT_ID,
)
from .control import ControlPlane
from .duplex_ha import DuplexSatellites
from .duplex_link import RoundEnds
from .kernel import ChannelRegistry, Kernel, PromptRegistry, ToolRunner
from .satellites.directory import SatelliteDirectory
from .sessions import SessionManager
from .wyoming_ha import WyomingSatellites


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

    def apply_options(self, options: Mapping[str, Any]) -> bool:
        """Apply changed options without a reload; False when a reload is needed.

        Everything applies in place (running conversations and the transcript
        archive stay; the entry's conversation settings reach the duplex
        satellites' next conversations too) except switching tools on or off: whether the model is
        offered tools at all (and ``ask_parent``) is wired into the kernel and the
        conversation entity when the entry loads, and adding or removing a duplex
        satellite or a Wyoming satellite (its link and entity are set up when the
        entry loads).
        """
        if list(options.get(CONF_DUPLEX_SATELLITES, [])) != list(
            self.duplex.configs.values()
        ):
            return False
        if list(options.get(CONF_WYOMING_SATELLITES, [])) != list(
            self.wyoming.configs.values()
        ):
            return False
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
        entry.options.get(CONF_DUPLEX_SATELLITES, []),
        sessions=sessions,
    )
    await duplex.async_start()
    wyoming = WyomingSatellites(
        hass,
        entry.entry_id,
        kernel,
        round_ends,
        entry.options.get(CONF_WYOMING_SATELLITES, []),
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
