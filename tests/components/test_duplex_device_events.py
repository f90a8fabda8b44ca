"""Duplex satellites in Home Assistant: timer events and a voice assistant held by another.

- Timers: a device that reports ``TIMERS`` gets HA's timer events for its device
  (``VoiceAssistantTimerEventResponse``), as HA's esphome satellite sends them in
  ``handle_timer_event`` (homeassistant/components/esphome/assist_satellite.py);
  without a handler HA's timer intents refuse the device ("does not support timers").
- A second API client owns the voice assistant: the project firmware announces its
  start (``esphome.rtvoice_start``) to every client, the link never gets it, and a
  repair issue says so; a start that reaches the link again clears it.

Real peers on 127.0.0.1 (the emulated device, the OpenAI-compatible peer, the
Wyoming speech servers), as in ``test_duplex_satellite``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from aioesphomeapi import APIClient
import pytest

from custom_components.rtvoice.const import DOMAIN
from custom_components.rtvoice.duplex_ha import ISSUE_VOICE_ASSISTANT_REFUSED
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.helpers import entity_registry as er, intent, issue_registry as ir
from tests.components.esphome_rig import wait
from tests.components.test_duplex_satellite import SAFETY, duplex_rig
from tests.peers.esphome import ATOM_ECHO_FEATURES, Kind
from tests.peers.esphome.actions import ProjectFirmware
from tests.peers.esphome.config import Feature
from tests.peers.openai_server import OpenAIPeer

pytestmark = pytest.mark.usefixtures("socket_enabled")


async def test_timer_events_reach_the_duplex_satellite(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """Start, then cancel a timer on the satellite's device: the device hears both."""
    async with duplex_rig(
        hass, tmp_path, openai_peer, features=ATOM_ECHO_FEATURES | Feature.TIMERS
    ) as rig:
        entity = er.async_get(hass).async_get(rig.satellite)
        assert entity is not None and entity.device_id
        since = rig.device.mark()
        await intent.async_handle(
            hass,
            "test",
            intent.INTENT_START_TIMER,
            {"minutes": {"value": 5}, "name": {"value": "tea"}},
            device_id=entity.device_id,
        )
        started = await wait(
            rig.device.wait_for(lambda e: e.kind is Kind.TIMER, since), SAFETY
        )
        timer = started.detail["timer"]
        assert (timer.event_type, timer.name, timer.total_seconds) == (0, "tea", 300)
        assert timer.is_active
        await intent.async_handle(
            hass,
            "test",
            intent.INTENT_CANCEL_TIMER,
            {"name": {"value": "tea"}},
            device_id=entity.device_id,
        )
        cancelled = await wait(
            rig.device.wait_for(lambda e: e.kind is Kind.TIMER, started.index + 1),
            SAFETY,
        )
        assert cancelled.detail["timer"].event_type == 2  # TIMER_CANCELLED
        assert cancelled.detail["timer"].timer_id == timer.timer_id
        assert rig.device.voice.timers == {}


async def test_a_voice_assistant_held_by_another_client_is_a_repair(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """The link loses the voice assistant to another client: a repair, gone again later."""
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        firmware = ProjectFirmware(rig.device)  # its scripts; the actions go unused
        key = next(iter(rig.entry.runtime_data.duplex.links))
        issue_id = f"{ISSUE_VOICE_ASSISTANT_REFUSED}_{rig.entry.entry_id}_{key}"
        registry = ir.async_get(hass)
        # The link drops off (Wi-Fi); another client subscribes before it is back.
        assert rig.device.voice.owner is not None
        dropped = rig.device.voice.owner.number
        since = rig.device.mark()
        rig.device.drop_connection()
        other = APIClient(
            rig.device.host,
            rig.device.port,
            None,
            client_info="other",
            noise_psk=rig.device.noise_psk,
        )
        await wait(other.connect(login=False), SAFETY)

        async def handle_start(*args: Any) -> int | None:
            return 0

        async def handle_stop(*args: Any) -> None:
            return None

        other.subscribe_voice_assistant(
            handle_start=handle_start, handle_stop=handle_stop
        )
        await wait(rig.device.wait_for_voice_client(since), SAFETY)
        try:
            # The link is back (a new connection) and follows the device's events.
            await wait(
                rig.device.wait_for(
                    lambda e: (
                        e.kind is Kind.RECEIVED
                        and e.name == "SubscribeHomeassistantServicesRequest"
                        and e.connection not in (dropped, 0)
                    ),
                    since,
                ),
                SAFETY,
            )
            assert registry.async_get_issue(DOMAIN, issue_id) is None
            rig.link.config = dataclasses.replace(rig.link.config, start_timeout=0.2)
            firmware.wake_word()
            issue = await wait(issue_state(hass, issue_id, present=True), SAFETY)
            assert issue is not None
            assert issue.translation_key == ISSUE_VOICE_ASSISTANT_REFUSED
            assert not issue.is_fixable
            assert issue.translation_placeholders == {"satellite": "Kitchen duplex"}
            rig.device.abort()
        finally:
            mark = rig.device.mark()
            await other.disconnect()
        await wait(rig.device.wait_for_disconnect(mark), SAFETY)
        # Nobody owns it now: this start is lost, but the link subscribes again.
        mark = rig.device.mark()
        firmware.wake_word()
        await wait(rig.device.wait_for_voice_client(mark), SAFETY)
        run = rig.device.wake()
        assert run is not None
        await wait(run.streaming.wait(), SAFETY)
        assert await wait(issue_state(hass, issue_id, present=False), SAFETY) is None


async def issue_state(
    hass: HomeAssistant, issue_id: str, *, present: bool
) -> ir.IssueEntry | None:
    """Wait until the issue ``issue_id`` exists (or is gone); return it."""
    registry = ir.async_get(hass)
    found: asyncio.Future[ir.IssueEntry | None] = hass.loop.create_future()

    @callback
    def changed(_event: Event[Any] | None = None) -> None:
        issue = registry.async_get_issue(DOMAIN, issue_id)
        if (issue is not None) is present and not found.done():
            found.set_result(issue)

    unsubscribe = hass.bus.async_listen(
        ir.EVENT_REPAIRS_ISSUE_REGISTRY_UPDATED, changed
    )
    try:
        changed()
        return await found
    finally:
        unsubscribe()
