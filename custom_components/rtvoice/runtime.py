"""What one config entry runs: the kernel, its registries, satellites and sessions."""

from __future__ import annotations

from dataclasses import dataclass

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant

from .brain import async_create_brain
from .kernel import ChannelRegistry, Kernel, PromptRegistry, ToolRunner
from .satellites import SatelliteDirectory
from .sessions import SessionManager


@dataclass
class RtVoiceRuntime:
    """Stored in ``entry.runtime_data``."""

    kernel: Kernel
    channels: ChannelRegistry
    prompts: PromptRegistry
    tools: ToolRunner | None
    satellites: SatelliteDirectory
    sessions: SessionManager

    async def async_shutdown(self) -> None:
        """Close every conversation (hand-off included) and stop listening."""
        await self.sessions.async_shutdown()
        self.satellites.async_stop()


type RtVoiceConfigEntry = ConfigEntry[RtVoiceRuntime]


async def async_build_runtime(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> RtVoiceRuntime:
    """Create the brain, the kernel and the satellite directory of an entry.

    Raises ConfigEntryNotReady / ConfigEntryAuthFailed when the brain cannot be used.
    """
    channels = ChannelRegistry()
    prompts = PromptRegistry()
    brain = await async_create_brain(hass, entry, prompts)
    sessions = SessionManager(hass, entry, brain, channels, prompts)
    satellites = SatelliteDirectory(
        hass, entry, channels, prompts, on_output=sessions.async_deliver_output
    )
    sessions.attach_satellites(satellites)
    await satellites.async_start()
    return RtVoiceRuntime(
        kernel=sessions.kernel,
        channels=channels,
        prompts=prompts,
        tools=brain.tools,
        satellites=satellites,
        sessions=sessions,
    )
