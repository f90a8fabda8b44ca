"""The pydantic boundary modules (issue 16 §5): link settings and Wyoming.

Bounds on tool-call arguments live in one place, the kernel (``kernel/bounds.py``,
tests/kernel/test_bounds.py).

HA-free: what each module accepts and refuses, and that secrets stay out of reprs.
The Wyoming reader's behaviour on a socket is in tests/duplex/test_wyoming_hostile.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from wyoming.event import Event

from custom_components.rtvoice.link_settings import (
    LinkSettingsError,
    esphome_settings,
    wyoming_settings,
)
from custom_components.rtvoice.wyoming_proto import (
    WyomingProtocolError,
    audio_chunk,
    peer_info,
    read_event,
)

KEY = "c2VjcmV0LWtleS0zMi1ieXRlcy1sb25nLWZvci10ZXN0"


def test_esphome_settings_hide_the_key() -> None:
    """The noise key is a SecretStr: not in repr or str; the link config gets it."""
    settings = esphome_settings({"host": " 10.0.0.5 ", "noise_psk": KEY, "name": "k"})
    assert KEY not in repr(settings)
    assert KEY not in str(settings)
    config = settings.link_config()
    assert (config.host, config.port, config.noise_psk) == ("10.0.0.5", 6053, KEY)
    assert KEY not in repr(config)
    assert (
        esphome_settings({"host": "h", "noise_psk": ""}).link_config().noise_psk is None
    )


@pytest.mark.parametrize(
    "conf",
    [{}, {"host": ""}, {"host": "h", "port": 0}, {"host": "h", "port": 70000}],
)
def test_unusable_link_settings_name_fields_not_values(conf: dict[str, object]) -> None:
    """A stored satellite without a usable address: an error naming the field."""
    with pytest.raises(LinkSettingsError) as caught:
        esphome_settings({**conf, "noise_psk": KEY})
    assert KEY not in str(caught.value)
    with pytest.raises(LinkSettingsError):
        wyoming_settings(conf)


def test_wyoming_settings_default_port() -> None:
    """A Wyoming satellite without a port is on 10700."""
    assert wyoming_settings({"host": "sat"}).port == 10700


def test_wyoming_models() -> None:
    """Info and audio format: checked, names cleaned; bad shapes are protocol errors."""
    info = peer_info(
        Event("info", {"satellite": {"name": "a\nb" + "c" * 200, "installed": True}})
    )
    assert info.is_satellite
    assert info.satellite is not None
    assert "\n" not in info.satellite.name
    assert len(info.satellite.name) <= 64
    for data in ({"satellite": 5}, {"satellite": {"name": 5}}):
        with pytest.raises(WyomingProtocolError):
            peer_info(Event("info", data))
    chunk = audio_chunk(
        Event("audio-chunk", {"rate": 8000, "width": 1, "channels": 2}, b"\0" * 4)
    )
    assert (chunk.rate, chunk.width, chunk.channels) == (8000, 1, 2)
    for data in (
        {"rate": 7999, "width": 2, "channels": 1},
        {"rate": 48001, "width": 2, "channels": 1},
        {"rate": 16000, "width": 5, "channels": 1},
        {"rate": 16000, "width": 2, "channels": 3},
        {},
    ):
        with pytest.raises(WyomingProtocolError):
            audio_chunk(Event("audio-chunk", data, b"\0" * 12))


async def test_read_event_merges_data_as_the_wyoming_package_does() -> None:
    """Inline data and data_length data are merged; a payload is read whole."""
    reader = asyncio.StreamReader()
    body = json.dumps({"b": 2}).encode()
    reader.feed_data(
        json.dumps(
            {
                "type": "t",
                "data": {"a": 1},
                "data_length": len(body),
                "payload_length": 3,
            }
        ).encode()
        + b"\n"
        + body
        + b"xyz"
    )
    reader.feed_eof()
    event = await read_event(reader)
    assert event is not None
    assert (event.type, event.data, event.payload) == ("t", {"a": 1, "b": 2}, b"xyz")
    assert await read_event(reader) is None
