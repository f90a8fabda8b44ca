"""Hostile zeroconf discoveries (issue 16 §2): probes bounded, names cleaned, rate-limited.

A discovery flow runs with no user action, for whatever an mDNS responder on the LAN
announces. The Wyoming peers are raw loopback sockets (tests/peers/hostile_wyoming.py)
that answer ``describe`` as they like; the flows are started the way HA's zeroconf
starts them (``SOURCE_ZEROCONF`` with a ``ZeroconfServiceInfo``). Peak memory is
measured with tracemalloc around the flow. Before: an ``info`` announcing 256 MB of
data waited out the 10 s probe timeout holding what was sent, a malformed ``info``
raised AttributeError out of the flow, every new name probed again, and a 5,000
character name reached the confirm dialog and the unique id verbatim.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
import contextlib
from ipaddress import ip_address
import re
import tracemalloc
from typing import Any

import pytest

from custom_components.rtvoice.const import DOMAIN
from custom_components.rtvoice.wyoming_ha import PROBES_PER_MINUTE
from homeassistant.config_entries import SOURCE_ZEROCONF
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers.service_info.zeroconf import ZeroconfServiceInfo
from tests.components.common import agent_entry
from tests.peers.hostile_wyoming import (
    HostileWyoming,
    Script,
    event_bytes,
    header,
    read_event_type,
    until_closed,
)

pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY = 30.0
MB = 1024 * 1024
UNESCAPED = re.compile(r"(?<!\\)[<>\[\]*#]")
HOSTILE_NAME = (
    "# Kitchen\n\n[click here](http://evil.example/) <img src=x onerror=alert(1)> "
    + "**" * 2500
)  # 5,000+ characters of markdown and HTML


def wyoming_info(host: str, port: int, name: str) -> ZeroconfServiceInfo:
    """Return what HA's zeroconf hands a flow for a ``_wyoming._tcp`` service."""
    return ZeroconfServiceInfo(
        ip_address=ip_address(host),
        ip_addresses=[ip_address(host)],
        port=port,
        hostname=f"{name[:40]}.local.",
        type="_wyoming._tcp.local.",
        name=f"{name}._wyoming._tcp.local.",
        properties={},
    )


def answering(info: dict[str, Any] | bytes) -> Script:
    """Return a script that answers ``describe`` with ``info`` (an event or raw bytes)."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while await read_event_type(reader) not in (None, "describe"):
            pass
        raw = info if isinstance(info, bytes) else event_bytes("info", info)
        writer.write(raw)
        await writer.drain()
        if isinstance(info, bytes) and b"data_length" in info:
            for _ in range(24):  # the announced body, if the probe reads it
                writer.write(b"\0" * MB)
                await writer.drain()
        await until_closed(reader)

    return script


SATELLITE = {"satellite": {"name": "kitchen", "installed": True, "version": "1.0"}}


@contextlib.contextmanager
def peak_memory() -> Iterator[list[int]]:
    """Measure the peak of traced memory inside the block (bytes, in the list)."""
    peak: list[int] = []
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


async def discover(hass: HomeAssistant, info: ZeroconfServiceInfo) -> Any:
    """Start a zeroconf flow; its first result."""
    async with asyncio.timeout(SAFETY):
        return await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_ZEROCONF}, data=info
        )


@pytest.mark.parametrize(
    "answer",
    [
        header({"type": "info", "data_length": 256 * MB}),
        header({"type": "info", "data": {"x": 1}, "payload_length": 256 * MB}),
        event_bytes("info", {"satellite": "kitchen"}),
        event_bytes("info", {"satellite": {"name": ["a"], "installed": True}}),
        header({"type": "info", "data": [1, 2]}),
        b"[" * 60000 + b"\n",
    ],
    ids=[
        "data-256MB",
        "payload-256MB",
        "satellite-str",
        "name-list",
        "data-list",
        "deep",
    ],
)
async def test_hostile_info_is_not_a_satellite(
    hass: HomeAssistant, answer: bytes
) -> None:
    """Oversized or malformed info: a clean abort at once, memory bounded."""
    async with HostileWyoming(answering(answer)) as peer:
        with peak_memory() as peak:
            result = await discover(hass, wyoming_info(peer.host, peer.port, "evil"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "not_wyoming_satellite"
    assert peak[0] < 8 * MB, f"peak {peak[0] / MB:.1f} MB"


async def test_probes_are_rate_limited_and_repeated_names_are_remembered(
    hass: HomeAssistant,
) -> None:
    """A flood of new names probes a few; a repeated name or host is not probed again."""
    async with HostileWyoming(answering({"asr": []})) as peer:  # an STT server
        # The same host:port under new names, and the same name again: one probe.
        results = [
            await discover(hass, wyoming_info(peer.host, peer.port, name))
            for name in ("first", "second", "third", "first")
        ]
        assert peer.connections == 1
        assert {r["reason"] for r in results} == {"not_wyoming_satellite"}

    # New hosts under new names: PROBES_PER_MINUTE probes, then refused.
    reasons = []
    async with contextlib.AsyncExitStack() as stack:
        peers = [
            await stack.enter_async_context(HostileWyoming(answering({"asr": []})))
            for _ in range(PROBES_PER_MINUTE + 4)
        ]
        for number, other in enumerate(peers):
            result = await discover(
                hass, wyoming_info(other.host, other.port, f"flood{number}")
            )
            reasons.append(result["reason"])
    assert sum(other.connections for other in peers) == PROBES_PER_MINUTE - 1
    assert reasons.count("probe_rate_limited") == 5


async def test_a_hostile_wyoming_name_is_cleaned_for_the_dialog_and_the_id(
    hass: HomeAssistant,
) -> None:
    """5,000 characters of markdown in the zeroconf name and the info: cut, escaped."""
    agent_entry(hass)
    info = {"satellite": {"name": HOSTILE_NAME, "installed": True}}
    async with HostileWyoming(answering(info)) as peer:
        result = await discover(hass, wyoming_info(peer.host, peer.port, HOSTILE_NAME))
    assert result["type"] is FlowResultType.FORM, result
    assert result["step_id"] == "wyoming_confirm"
    name = result["description_placeholders"]["name"]
    assert len(name) < 200
    assert not UNESCAPED.search(name), name  # no markup left
    assert "\n" not in name
    flow = hass.config_entries.flow.async_get(result["flow_id"])
    unique_id = flow["context"]["unique_id"]
    assert len(unique_id) < 200
    assert "\n" not in unique_id
    title = flow["context"]["title_placeholders"]["name"]
    assert len(title) <= 64
    hass.config_entries.flow.async_abort(result["flow_id"])


def esphome_info(mac: str, friendly_name: str) -> ZeroconfServiceInfo:
    """Return an ESPHome announcement (encrypted: the confirm form asks the key)."""
    return ZeroconfServiceInfo(
        ip_address=ip_address("127.0.0.1"),
        ip_addresses=[ip_address("127.0.0.1")],
        port=1,
        hostname="evil.local.",
        type="_esphomelib._tcp.local.",
        name="evil._esphomelib._tcp.local.",
        properties={
            "mac": mac,
            "friendly_name": friendly_name,
            "api_encryption": "Noise_NNpsk0_25519_ChaChaPoly_SHA256",
        },
    )


async def test_a_hostile_esphome_announcement_is_cleaned(hass: HomeAssistant) -> None:
    """A huge friendly name is cut and escaped; a MAC that is none aborts."""
    agent_entry(hass)
    result = await discover(hass, esphome_info("x" * 5000, "kitchen"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "mdns_missing_mac"
    result = await discover(hass, esphome_info("AABBCCDDEEFF", HOSTILE_NAME))
    assert result["type"] is FlowResultType.FORM, result
    assert result["step_id"] == "esphome_confirm"
    name = result["description_placeholders"]["name"]
    assert len(name) < 200
    assert not UNESCAPED.search(name), name  # no markup left
    flow = hass.config_entries.flow.async_get(result["flow_id"])
    assert flow["context"]["unique_id"] == "aa:bb:cc:dd:ee:ff"
    assert len(flow["context"]["title_placeholders"]["name"]) <= 64
    hass.config_entries.flow.async_abort(result["flow_id"])
