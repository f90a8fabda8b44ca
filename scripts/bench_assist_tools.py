"""HA's Assist LLM API tool list, for the request-building benchmark (row 7).

Captured from Home Assistant 2025.4.4's ``assist`` LLM API with the full ``demo``
integration set up and every entity exposed (17 tools, schemas converted the way
``tools.py`` converts them), plus the list and timer tools a home with to-do lists
and a satellite adds (3, written in the same shape): 20 tools.
"""

from __future__ import annotations

from typing import Any

ASSIST_TOOLS: list[dict[str, Any]] = [
    {
        "name": "HassTurnOn",
        "description": "Turns on/opens a device or entity",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {"type": "array", "items": {"type": "string"}},
                "device_class": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "enum": [
                            "water",
                            "gas",
                            "outlet",
                            "switch",
                            "awning",
                            "blind",
                            "curtain",
                            "damper",
                            "door",
                            "garage",
                            "gate",
                            "shade",
                            "shutter",
                            "window",
                            "tv",
                            "speaker",
                            "receiver",
                        ],
                    },
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassTurnOff",
        "description": "Turns off/closes a device or entity",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {"type": "array", "items": {"type": "string"}},
                "device_class": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "enum": [
                            "water",
                            "gas",
                            "outlet",
                            "switch",
                            "awning",
                            "blind",
                            "curtain",
                            "damper",
                            "door",
                            "garage",
                            "gate",
                            "shade",
                            "shutter",
                            "window",
                            "tv",
                            "speaker",
                            "receiver",
                        ],
                    },
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassSetPosition",
        "description": "Sets the position of a device or entity",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {"type": "array", "items": {"type": "string"}},
                "device_class": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "enum": [
                            "water",
                            "gas",
                            "awning",
                            "blind",
                            "curtain",
                            "damper",
                            "door",
                            "garage",
                            "gate",
                            "shade",
                            "shutter",
                            "window",
                        ],
                    },
                },
                "position": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["position"],
        },
    },
    {
        "name": "HassCancelAllTimers",
        "description": "Cancels all timers",
        "parameters": {
            "type": "object",
            "properties": {"area": {"type": "string"}},
            "required": [],
        },
    },
    {
        "name": "HassClimateSetTemperature",
        "description": "Sets the target temperature of a climate device or entity",
        "parameters": {
            "type": "object",
            "properties": {
                "temperature": {"type": "number"},
                "area": {"type": "string"},
                "name": {"type": "string"},
                "floor": {"type": "string"},
            },
            "required": ["temperature"],
        },
    },
    {
        "name": "HassHumidifierSetpoint",
        "description": "Set desired humidity level",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["name", "humidity"],
        },
    },
    {
        "name": "HassHumidifierMode",
        "description": "Set humidifier mode",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "mode": {"type": "string"}},
            "required": ["name", "mode"],
        },
    },
    {
        "name": "HassVacuumStart",
        "description": "Starts a vacuum",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["vacuum"]},
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassVacuumReturnToBase",
        "description": "Returns a vacuum to base",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["vacuum"]},
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassMediaUnpause",
        "description": "Resumes a media player",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["media_player"]},
                },
                "device_class": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["tv", "speaker", "receiver"]},
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassMediaPause",
        "description": "Pauses a media player",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["media_player"]},
                },
                "device_class": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["tv", "speaker", "receiver"]},
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassMediaNext",
        "description": "Skips a media player to the next item",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["media_player"]},
                },
                "device_class": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["tv", "speaker", "receiver"]},
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassMediaPrevious",
        "description": "Replays the previous item for a media player",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["media_player"]},
                },
                "device_class": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["tv", "speaker", "receiver"]},
                },
            },
            "required": [],
        },
    },
    {
        "name": "HassSetVolume",
        "description": "Sets the volume percentage of a media player",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["media_player"]},
                },
                "device_class": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["tv", "speaker", "receiver"]},
                },
                "volume_level": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 100,
                    "description": "The volume percentage of the media player",
                },
            },
            "required": ["volume_level"],
        },
    },
    {
        "name": "HassLightSet",
        "description": "Sets the brightness percentage or color of a light",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "area": {"type": "string"},
                "floor": {"type": "string"},
                "domain": {"type": "array", "items": {"type": "string"}},
                "color": {"type": "string"},
                "temperature": {"type": "integer", "minimum": 0},
                "brightness": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 100,
                    "description": "The brightness "
                    "percentage of the light "
                    "between 0 and 100, "
                    "where 0 is off and 100 "
                    "is fully lit",
                },
            },
            "required": [],
        },
    },
    {
        "name": "calendar_get_events",
        "description": "Get events from a calendar. When asked if something happens, search "
        "the whole week. Results are RFC 5545 which means 'end' is exclusive.",
        "parameters": {
            "type": "object",
            "properties": {
                "calendar": {"type": "string", "enum": ["Calendar 1", "Calendar 2"]},
                "range": {"type": "string", "enum": ["today", "week"]},
            },
            "required": ["calendar", "range"],
        },
    },
    {
        "name": "HassListAddItem",
        "description": "Add item to a todo list",
        "parameters": {
            "type": "object",
            "properties": {
                "item": {"type": "string"},
                "name": {"type": "string", "enum": ["Shopping List", "Reminders"]},
            },
            "required": ["item", "name"],
        },
    },
    {
        "name": "HassListCompleteItem",
        "description": "Complete item on a todo list",
        "parameters": {
            "type": "object",
            "properties": {
                "item": {"type": "string"},
                "name": {"type": "string", "enum": ["Shopping List", "Reminders"]},
            },
            "required": ["item", "name"],
        },
    },
    {
        "name": "HassStartTimer",
        "description": "Starts a new timer",
        "parameters": {
            "type": "object",
            "properties": {
                "hours": {"type": "integer", "minimum": 0},
                "minutes": {"type": "integer", "minimum": 0},
                "seconds": {"type": "integer", "minimum": 0},
                "name": {"type": "string"},
                "conversation_command": {"type": "string"},
            },
            "required": [],
        },
    },
    {
        "name": "GetLiveContext",
        "description": "Use this tool when the user asks a question about the CURRENT state, "
        "value, or mode of a specific device, sensor, entity, or area in the "
        "smart home, and the answer can be improved with real-time data not "
        "available in the static device overview list. ",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
]
