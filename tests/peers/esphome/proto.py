"""Message classes whose names differ between aioesphomeapi generations.

The emulator builds the device side from the client's own protobuf classes
(``aioesphomeapi.api_pb2``), so it runs against whichever aioesphomeapi the venv
has: 29.9.0 (HA 2025.4.4's pin, the main suite) or 46.x (HA 2026.11's, the run of
``scripts/test_esphome_latest``). The wire types are the same; only the generated
names moved with ESPHome's ``api.proto``:

- ``ConnectRequest``/``ConnectResponse`` (type 3/4) became
  ``AuthenticationRequest``/``AuthenticationResponse``
  (``api_connection.cpp``: ``APIConnection::on_authentication_request``);
- ``HomeassistantServiceResponse`` (type 35, what ``homeassistant.action`` and
  ``homeassistant.event`` send) became ``HomeassistantActionRequest``
  (``api_server.cpp``: ``APIServer::send_homeassistant_action``).
"""

from __future__ import annotations

from typing import Any

from aioesphomeapi import api_pb2


def _first(*names: str) -> Any:
    for name in names:
        if (cls := getattr(api_pb2, name, None)) is not None:
            return cls
    raise AttributeError(f"api_pb2 has none of {names}")


ConnectRequest: Any = _first("ConnectRequest", "AuthenticationRequest")
ConnectResponse: Any = _first("ConnectResponse", "AuthenticationResponse")
HomeassistantAction: Any = _first(
    "HomeassistantActionRequest", "HomeassistantServiceResponse"
)


def build(cls: Any, **fields: Any) -> Any:
    """Return ``cls(**fields)`` without the fields this generation dropped.

    46.x dropped ``unique_id`` from the ``ListEntities*Response`` messages
    (ESPHome 2025.x stopped sending it; clients derive it from the object id).
    """
    known = {field.name for field in cls.DESCRIPTOR.fields}
    return cls(**{name: value for name, value in fields.items() if name in known})
