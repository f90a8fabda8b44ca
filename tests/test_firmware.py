"""The satellite firmware reports what Realtime Voice's duplex mode needs.

`scripts/firmware` validates every `firmware/*.yaml` with ESPHome (config and
generated C++, offline) and leaves the output in `firmware/.build/`; `.ci/run`
runs it before the tests. These tests read that output, so firmware and
integration cannot drift apart. Without it (no esphome venv on this machine)
they skip and say how to get it.

A device's voice-assistant feature flags are computed at run time by
`VoiceAssistant::get_feature_flags()` from which outputs were configured. The
test evaluates that function's conditions, read from the header ESPHome
copied into the build, against the setters the generated `main.cpp` calls: a
change on either side (our YAML or ESPHome) shows up here.
"""

from __future__ import annotations

from dataclasses import dataclass
import hashlib
import json
from pathlib import Path
import re
from typing import Final

from aioesphomeapi.model import VoiceAssistantFeature
import pytest

from custom_components.rtvoice.esphome_link import (
    ACTION_DUPLEX,
    ACTION_START_LISTENING,
    ACTION_STOP_SPEAKER,
    EVENT_BARGE_IN,
    EVENT_START,
)

# The voice-assistant features duplex mode needs from a satellite: raw PCM
# both ways over the API connection, a speaker that plays it, timers. The
# integration should own this (custom_components/rtvoice/const.py) and check a
# device's `voice_assistant_feature_flags` against it; it lives here until then.
#
# Not ANNOUNCE / START_CONVERSATION: stock ESPHome reports those only for a
# `media_player:` output, which excludes the raw-audio `speaker:` output
# (cv.Exclusive in voice_assistant). The firmware offers the API actions below
# instead: the integration starts the microphone itself and plays raw audio.
DUPLEX_REQUIRED_FEATURES: Final = frozenset(
    {
        VoiceAssistantFeature.VOICE_ASSISTANT,
        VoiceAssistantFeature.SPEAKER,
        VoiceAssistantFeature.API_AUDIO,
        VoiceAssistantFeature.TIMERS,
    }
)
# API actions (ExecuteServiceRequest) every Realtime Voice firmware offers: the
# link calls the last three (esphome_link: start a run, report barge-ins instead
# of restarting, silence the speaker at a barge-in).
FIRMWARE_ACTIONS: Final = (
    "stop_listening",
    ACTION_START_LISTENING,
    ACTION_DUPLEX,
    ACTION_STOP_SPEAKER,
)
# Home Assistant events (homeassistant.event) the link subscribes to.
FIRMWARE_EVENTS: Final = (EVENT_BARGE_IN, EVENT_START)
# Device info project names: full duplex plays while it listens (vad barge-in
# possible with echo cancellation), half duplex cannot (one shared I2S bus).
PROJECT_NAMES: Final = ("rtvoice.full-duplex", "rtvoice.half-duplex")

ROOT: Final = Path(__file__).resolve().parent.parent
FIRMWARE: Final = ROOT / "firmware"
BUILD: Final = FIRMWARE / ".build"

# get_feature_flags() condition (a member of VoiceAssistant) -> the setter
# whose call in main.cpp makes it true.
_CONDITION_SETTERS: Final = {
    "speaker_": re.compile(r"\bva->set_speaker\("),
    "media_player_": re.compile(r"\bva->set_media_player\("),
    "mic_source2_": re.compile(r"\bva->set_microphone_source2\("),
    "has_timers_": re.compile(r"\bva->set_has_timers\(true\)"),
}


def _firmware_files() -> list[str]:
    """Top-level firmware files (what a user flashes), secrets excepted."""
    return sorted(
        p.name for p in FIRMWARE.glob("*.yaml") if not p.name.startswith("secrets")
    )


def _sources_sha256() -> str:
    """Hash the sources as scripts/firmware does when it records them."""
    digest = hashlib.sha256()
    paths = [*FIRMWARE.glob("*.yaml"), *FIRMWARE.glob("packages/*.yaml")]
    for path in sorted(paths):
        if not path.name.startswith("secrets"):
            digest.update(
                str(path.relative_to(FIRMWARE)).encode() + b"\0" + path.read_bytes()
            )
    return digest.hexdigest()


@pytest.fixture(scope="module")
def record() -> dict[str, object]:
    """Load what scripts/firmware validated; skip when it has not run here."""
    path = BUILD / "validated.json"
    if not path.is_file():
        pytest.skip(
            "no firmware build output: run scripts/firmware (it makes ESPHome's "
            "own venv in firmware/.venv; .ci/run always does)"
        )
    data: dict[str, object] = json.loads(path.read_text())
    assert data["sources_sha256"] == _sources_sha256(), (
        "firmware/ changed since scripts/firmware ran: run it again"
    )
    assert data["files"] == _firmware_files()
    return data


@dataclass(frozen=True)
class _Build:
    """ESPHome's generated code for one firmware file."""

    main_cpp: str
    defines_h: str
    va_header: str


def _build(name: str) -> _Build:
    (device,) = (BUILD / name.removesuffix(".yaml") / ".esphome/build").iterdir()
    src = device / "src"
    return _Build(
        main_cpp=(src / "main.cpp").read_text(),
        defines_h=(src / "esphome/core/defines.h").read_text(),
        va_header=(
            src / "esphome/components/voice_assistant/voice_assistant.h"
        ).read_text(),
    )


def _feature_values(header: str) -> dict[str, int]:
    """VoiceAssistantFeature members and their bits, from the header."""
    body = re.search(r"enum VoiceAssistantFeature[^{]*\{(.*?)\};", header, re.DOTALL)
    assert body, "VoiceAssistantFeature enum not found in voice_assistant.h"
    return {
        name: 1 << int(shift)
        for name, shift in re.findall(r"FEATURE_(\w+)\s*=\s*1\s*<<\s*(\d+)", body[1])
    }


def _feature_conditions(header: str) -> dict[str, str | None]:
    """Each flag get_feature_flags() sets -> the member it depends on (or None).

    Reads the function's body line by line: `if (this->member ...) {` opens a
    condition, `}` closes one, `flags |= ...FEATURE_X;` records X under the
    innermost open condition. Preprocessor lines are ignored (the build defines
    USE_SPEAKER / USE_MEDIA_PLAYER when the outputs exist).
    """
    body = re.search(
        r"get_feature_flags\(\) const \{(.*?)return flags;", header, re.DOTALL
    )
    assert body, "get_feature_flags() not found in voice_assistant.h"
    conditions: dict[str, str | None] = {}
    stack: list[str] = []
    for raw in body[1].splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if match := re.match(r"if \(this->(\w+)", line):
            stack.append(match[1])
        elif line == "}":
            stack.pop()
        elif match := re.match(
            r"flags \|= VoiceAssistantFeature::FEATURE_(\w+);", line
        ):
            conditions[match[1]] = stack[-1] if stack else None
        elif line != "uint32_t flags = 0;":
            pytest.fail(f"get_feature_flags() has a line this test cannot read: {line}")
    return conditions


def _reported_features(build: _Build) -> set[str]:
    """Compute the flags the device would report, by the header's own rules."""
    reported = set()
    for flag, member in _feature_conditions(build.va_header).items():
        if member is None:
            reported.add(flag)
            continue
        assert member in _CONDITION_SETTERS, (
            f"ESPHome's get_feature_flags() now depends on {member}: "
            "teach _CONDITION_SETTERS which setter sets it"
        )
        if _CONDITION_SETTERS[member].search(build.main_cpp):
            reported.add(flag)
    return reported


@pytest.mark.parametrize("name", _firmware_files())
def test_reports_duplex_features(record: dict[str, object], name: str) -> None:
    """Every firmware reports at least the features duplex mode needs."""
    build = _build(name)
    values = _feature_values(build.va_header)
    for feature in DUPLEX_REQUIRED_FEATURES:
        # The bits the device sends are the ones aioesphomeapi decodes.
        assert values[feature.name] == feature.value
    reported = _reported_features(build)
    assert {f.name for f in DUPLEX_REQUIRED_FEATURES} <= reported, reported


@pytest.mark.parametrize("name", _firmware_files())
def test_offers_actions_and_project(record: dict[str, object], name: str) -> None:
    """The API actions the integration calls exist; the project says the duplex."""
    build = _build(name)
    for action in FIRMWARE_ACTIONS:
        assert f'"{action}"' in build.main_cpp
    for event in FIRMWARE_EVENTS:
        assert f'"{event}"' in build.main_cpp
    project = re.search(r'#define ESPHOME_PROJECT_NAME "([^"]+)"', build.defines_h)
    assert project
    assert project[1] in PROJECT_NAMES


@pytest.mark.parametrize("name", _firmware_files())
def test_wake_word_keeps_running(record: dict[str, object], name: str) -> None:
    """A detection does not stop microWakeWord (barge-in by wake word)."""
    assert "mww->set_stop_after_detection(false);" in _build(name).main_cpp


@pytest.mark.parametrize("name", _firmware_files())
def test_states_validated_version(record: dict[str, object], name: str) -> None:
    """Each file names the ESPHome version it was validated with: the pinned one."""
    version = record["esphome"]
    assert f"Validated with ESPHome {version}" in (FIRMWARE / name).read_text()
    pins = (FIRMWARE / "requirements.txt").read_text()
    assert f"esphome=={version}" in pins
