"""Constants of the Realtime Voice integration.

Every config entry key, option key and default lives here, so each concept has exactly
one definition that the config flow, the conversation agent and the tests share.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "rtvoice"

DEFAULT_NAME: Final = "Realtime Voice"

# --- config entry data ----------------------------------------------------------------

# Which "brain" answers: an OpenAI-compatible chat endpoint, or an existing Home
# Assistant conversation agent (offline / no LLM).
CONF_BRAIN: Final = "brain"
BRAIN_OPENAI: Final = "openai"
BRAIN_HA_AGENT: Final = "ha_agent"

CONF_NAME: Final = "name"

# OpenAI-compatible brain. The API key is optional (local servers need none) and is
# absent from the entry data when not set.
CONF_BASE_URL: Final = "base_url"
CONF_API_KEY: Final = "api_key"
CONF_MODEL: Final = "model"
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
DEFAULT_MODEL: Final = "gpt-4o-mini"
# Seconds allowed for the connection check of the config flow.
VALIDATION_TIMEOUT: Final = 15.0

# Home Assistant conversation agent brain: an agent id as the conversation agent
# selector returns it (an entity id, or a legacy agent's config entry id).
CONF_AGENT_ID: Final = "agent_id"
# Config flow → first setup: create a "Realtime Voice" assistant (assistant.py).
CONF_CREATE_ASSISTANT: Final = "create_assistant"
DEFAULT_AGENT_ID: Final = "conversation.home_assistant"  # the built-in intent agent

# --- options ----------------------------------------------------------------------------

# System prompt template; empty = the kernel's built-in realtime prompt.
CONF_PROMPT: Final = "prompt"
DEFAULT_PROMPT: Final = ""

# Home Assistant LLM API whose tools the model may call (openai brain only).
CONF_LLM_HASS_API: Final = "llm_hass_api"
LLM_API_NONE: Final = "none"  # no tools
DEFAULT_LLM_HASS_API: Final = "assist"  # homeassistant.helpers.llm.LLM_API_ASSIST

# Token window of the context sent to the model (openai brain only).
CONF_CONTEXT_WINDOW: Final = "context_window"
DEFAULT_CONTEXT_WINDOW: Final = 8000
MIN_CONTEXT_WINDOW: Final = 1000
MAX_CONTEXT_WINDOW: Final = 200000

# Tool-call turns per input (openai brain only): 0 = the kernel's ceiling (25), never
# unlimited: a model that calls tools for ever is stopped (issue 16).
CONF_MAX_TOOL_TURNS: Final = "max_tool_turns"
DEFAULT_MAX_TOOL_TURNS: Final = 8
MIN_MAX_TOOL_TURNS: Final = 0
MAX_MAX_TOOL_TURNS: Final = 25

# Characters of one answer; a longer answer ends there (openai brain only).
CONF_MAX_ANSWER_CHARS: Final = "max_answer_chars"
DEFAULT_MAX_ANSWER_CHARS: Final = 4000
MIN_MAX_ANSWER_CHARS: Final = 100
MAX_MAX_ANSWER_CHARS: Final = 200000

# Sampling temperature (openai brain only).
CONF_TEMPERATURE: Final = "temperature"
DEFAULT_TEMPERATURE: Final = 0.7
MIN_TEMPERATURE: Final = 0.0
MAX_TEMPERATURE: Final = 2.0

# Seconds to wait for the model's first token (or tool call) of a request: covers
# connecting and the server loading a model on first use (openai brain only).
CONF_FIRST_TOKEN_TIMEOUT: Final = "first_token_timeout"
DEFAULT_FIRST_TOKEN_TIMEOUT: Final = 30
MIN_FIRST_TOKEN_TIMEOUT: Final = 2
MAX_FIRST_TOKEN_TIMEOUT: Final = 600

# Seconds allowed between two pieces of a streaming answer: a stream that stops
# for longer fails the round at once instead of stalling (openai brain only).
CONF_CHUNK_TIMEOUT: Final = "chunk_timeout"
DEFAULT_CHUNK_TIMEOUT: Final = 10
MIN_CHUNK_TIMEOUT: Final = 1
MAX_CHUNK_TIMEOUT: Final = 120

# Seconds without input after which a conversation closes (transcript hand-off).
CONF_IDLE_TIMEOUT: Final = "idle_timeout"
DEFAULT_IDLE_TIMEOUT: Final = 300
MIN_IDLE_TIMEOUT: Final = 10
MAX_IDLE_TIMEOUT: Final = 3600

# Carry an input superseded before any output over into the next input.
CONF_CARRY_OVER: Final = "carry_over"
DEFAULT_CARRY_OVER: Final = True

# Options offered (and created with the entry) per brain. The ha_agent brain delegates
# tools, sampling and context handling to the chosen agent.
DEFAULT_OPTIONS_HA_AGENT: Final = {
    CONF_PROMPT: DEFAULT_PROMPT,
    CONF_IDLE_TIMEOUT: DEFAULT_IDLE_TIMEOUT,
    CONF_CARRY_OVER: DEFAULT_CARRY_OVER,
}
DEFAULT_OPTIONS_OPENAI: Final = {
    CONF_PROMPT: DEFAULT_PROMPT,
    CONF_LLM_HASS_API: DEFAULT_LLM_HASS_API,
    CONF_CONTEXT_WINDOW: DEFAULT_CONTEXT_WINDOW,
    CONF_MAX_TOOL_TURNS: DEFAULT_MAX_TOOL_TURNS,
    CONF_MAX_ANSWER_CHARS: DEFAULT_MAX_ANSWER_CHARS,
    CONF_TEMPERATURE: DEFAULT_TEMPERATURE,
    CONF_FIRST_TOKEN_TIMEOUT: DEFAULT_FIRST_TOKEN_TIMEOUT,
    CONF_CHUNK_TIMEOUT: DEFAULT_CHUNK_TIMEOUT,
    CONF_IDLE_TIMEOUT: DEFAULT_IDLE_TIMEOUT,
    CONF_CARRY_OVER: DEFAULT_CARRY_OVER,
}

# --- events and signals -------------------------------------------------------------------

# Fired when a conversation closes: data id, messages, chars, satellite (no text).
EVENT_CONVERSATION_CLOSED: Final = "rtvoice_conversation_closed"
# Fired when a conversation's model asks the parent: data id, question_id, chars,
# satellite (no text: read it with rtvoice.get_question).
EVENT_ASK_PARENT: Final = "rtvoice_ask_parent"
# Dispatcher signal (format with the entry id) sent by the SessionManager whenever a
# conversation's state or counters change: args (satellite_entity_id | None,
# kernel ChildStats; state STATE_CLOSED in a conversation's last update).
SIGNAL_SESSION_UPDATE: Final = "rtvoice_session_update_{}"
# State of a conversation in its last update (the kernel's ChildState otherwise).
STATE_CLOSED: Final = "closed"
# The kernel's id of the parent (the control plane); never a conversation id.
PARENT_ID: Final = "parent"
# Owner of the global prompt sections that come from Home Assistant itself.
PROMPT_OWNER_HASS: Final = "hass"

# --- duplex satellites (issue 10) ---------------------------------------------------------

# The satellites an entry owns are config subentries (satellites/stored.py), one per
# satellite, of these types. An ESPHome satellite's data: host, port, noise_psk
# (None: plaintext), name, mac and esphome_version (from the device when it was
# added), and the per-satellite settings below.
SUBENTRY_ESPHOME: Final = "esphome_satellite"
SUBENTRY_WYOMING: Final = "wyoming_satellite"
# Options of entries before version 1.3, where the satellites were kept as lists of
# the same mappings (moved into subentries by the migration).
CONF_DUPLEX_SATELLITES: Final = "duplex_satellites"
CONF_NOISE_PSK: Final = "noise_psk"
CONF_MAC: Final = "mac"
CONF_ESPHOME_VERSION: Final = "esphome_version"
DEFAULT_ESPHOME_PORT: Final = 6053

# Per-satellite settings, stored in each satellite's dict (ESPHome duplex and
# Wyoming satellites alike; absent keys take the defaults).
CONF_BARGE_IN: Final = "barge_in"  # "vad" | "wake_word" | "off" (duplex.BargeIn)
DEFAULT_BARGE_IN: Final = "wake_word"  # safe on boards without echo cancellation
# Server echo cancellation: AEC3 (livekit) where its wheel runs, else ours in numpy.
CONF_ECHO_CANCELLATION: Final = "echo_cancellation"
# Off: the default barge-in (`wake_word`) does not need it, and over a loud echo
# `vad` still misses its goals with either canceller (docs/benchmarks.md, "Echo
# cancellation in real rooms": no self-interruptions, but onset -> pause p99
# 310 ms at +10 dB and false barge-ins with a TV on).
DEFAULT_ECHO_CANCELLATION: Final = False
CONF_END_SILENCE: Final = "end_silence"  # seconds of silence after an answer
DEFAULT_END_SILENCE: Final = 8
# End of turn by what was said (duplex/turn.py): "off" | "low" | "medium" | "high"
# | "auto" (medium); off ends a turn by silence alone. Auto by default since an
# early end is revocable until its answer is heard (row 22 of docs/benchmarks.md:
# 1 % false cut-offs with realistic peers, was 7 %); a stored value stays.
CONF_TURN_EAGERNESS: Final = "turn_eagerness"
DEFAULT_TURN_EAGERNESS: Final = "auto"
TURN_EAGERNESS_OFF: Final = "off"
# A Wyoming satellite's data: host, port, name, plus the per-satellite settings
# above and CONF_WAKE_WORD (before 1.3: a list in the options under this key).
CONF_WYOMING_SATELLITES: Final = "wyoming_satellites"
CONF_WAKE_WORD: Final = "wake_word"  # a bundled model id, or "satellite"
DEFAULT_WYOMING_PORT: Final = 10700
