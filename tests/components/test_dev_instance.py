"""The development instance (scripts/develop, config/) behaves like a stock install.

Issue 12 items 16 and 17: the configuration loads automations, scripts and scenes
made in the UI from the files a stock installation has, and the dev helper gives the
preferred Assist pipeline speech engines that work offline. Issue 17 item 6: offline
it does not look broken (no traceback per dashboard load from the demo players'
internet pictures, no failing onboarding entries, the helper not offered in *Add
integration*). Walking README's first use: adding the first ESPHome device does not
make Home Assistant pip-install anything (it did for dhcp, and that broke DNS).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
import shutil
import subprocess
import sys
from types import ModuleType
from unittest.mock import patch

import aiohttp
from packaging.requirements import Requirement
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    MockModule,
    mock_integration,
)
from pytest_homeassistant_custom_component.test_util.aiohttp import AiohttpClientMocker

from homeassistant import config as conf_util, loader
import homeassistant.components
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.media_player import DATA_COMPONENT
from homeassistant.config_entries import (
    SIGNAL_CONFIG_ENTRY_CHANGED,
    ConfigEntryChange,
    ConfigEntryState,
)
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.setup import async_setup_component

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "config"
DEVELOP = ROOT / "scripts" / "develop"
SETUP = ROOT / "scripts" / "setup"
REQUIREMENTS_TEST = ROOT / "requirements_test.txt"
COMPONENTS = Path(homeassistant.components.__path__[0])

# docs/actions.md's first example, as the automation editor stores it.
UI_AUTOMATION = """
- id: "1700000000000"
  alias: Keep each transcript
  triggers:
    - trigger: event
      event_type: rtvoice_conversation_closed
  actions:
    - action: persistent_notification.create
      data:
        message: "Conversation {{ trigger.event.data.id }} closed"
"""


def make_stock_files(config_dir: Path) -> None:
    """Run the lines of scripts/develop that create the included files."""
    lines = [
        line
        for line in DEVELOP.read_text().splitlines()
        if line.rstrip().endswith("# stock-file")
    ]
    assert len(lines) == 3
    subprocess.run(
        ["bash", "-euc", "\n".join(lines)],
        env={"CONFIG_DIR": str(config_dir)},
        check=True,
    )


async def test_ui_automations_scripts_and_scenes_load(
    hass: HomeAssistant, tmp_path: Path
) -> None:
    """The includes resolve to the stock files, and a UI-made automation loads."""
    shutil.copy(CONFIG / "configuration.yaml", tmp_path)
    make_stock_files(tmp_path)
    assert (tmp_path / "automations.yaml").read_text() == "[]"
    (tmp_path / "scripts.yaml").write_text("")
    # A file that exists is kept.
    (tmp_path / "automations.yaml").write_text(UI_AUTOMATION)
    make_stock_files(tmp_path)
    assert (tmp_path / "automations.yaml").read_text() == UI_AUTOMATION

    hass.config.config_dir = str(tmp_path)
    config = await conf_util.async_hass_config_yaml(hass)
    assert "script" in config
    assert "scene" in config
    assert await async_setup_component(
        hass, "automation", {"automation": config["automation"]}
    )
    await hass.async_block_till_done()
    state = hass.states.get("automation.keep_each_transcript")
    assert state is not None and state.state == "on"


def test_the_included_files_are_git_ignored() -> None:
    """What the UI writes into config/ never shows up in git."""
    for name in ("automations.yaml", "scripts.yaml", "scenes.yaml"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", f"config/{name}"], cwd=ROOT, check=False
        )
        assert ignored.returncode == 0, name


def load_dev_helper() -> ModuleType:
    """Import config/custom_components/rtvoice_dev (not on the test's path)."""
    path = CONFIG / "custom_components" / "rtvoice_dev" / "__init__.py"
    spec = importlib.util.spec_from_file_location("rtvoice_dev_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_dev_pipeline_gets_offline_speech_engines(
    hass: HomeAssistant, tmp_path: Path
) -> None:
    """The first pipeline lacks TTS (the demo TTS loads late): it gets the demo TTS."""
    hass.config.config_dir = str(tmp_path)  # the TTS cache
    with patch(
        "homeassistant.components.tts._init_tts_cache_dir", return_value=str(tmp_path)
    ):
        assert await async_setup_component(hass, "assist_pipeline", {})
        await hass.async_block_till_done()
        first = async_get_pipeline(hass)
        assert first.tts_engine is None  # what a fresh dev instance started with
        with (
            patch(
                "homeassistant.components.demo.COMPONENTS_WITH_CONFIG_ENTRY_DEMO_PLATFORM",
                [Platform.STT],
            ),
            patch(
                "homeassistant.components.demo.COMPONENTS_WITH_DEMO_PLATFORM",
                [Platform.TTS],
            ),
        ):
            assert await async_setup_component(hass, "demo", {"demo": {}})
            await hass.async_block_till_done()

        await load_dev_helper().async_complete_pipeline(hass)
        pipeline = async_get_pipeline(hass)
        assert pipeline.id == first.id
        assert pipeline.tts_engine == "demo"
        assert pipeline.tts_language == "en"
        assert pipeline.stt_engine == "stt.demo_stt"

        # A choice made in the UI stays.
        await async_update_pipeline(
            hass, pipeline, tts_engine="demo", tts_language="de"
        )
        await load_dev_helper().async_complete_pipeline(hass)
        assert async_get_pipeline(hass).tts_language == "de"


async def test_the_dev_helper_is_not_offered_in_add_integration(
    hass: HomeAssistant,
) -> None:
    """Its manifest keeps it out of the list the frontend's Add integration shows."""
    hass.config.config_dir = str(CONFIG)
    hass.data.pop(loader.DATA_CUSTOM_COMPONENTS, None)
    descriptions = await loader.async_get_integration_descriptions(hass)
    custom = descriptions["custom"]
    assert "rtvoice_dev" not in {**custom["integration"], **custom["helper"]}
    assert "rtvoice" in custom["integration"]  # the integration itself is offered
    hass.data.pop(loader.DATA_CUSTOM_COMPONENTS, None)


async def test_failing_onboarding_entries_that_need_the_internet_are_removed(
    hass: HomeAssistant,
) -> None:
    """Met.no added by onboarding and failing: removed; others and the user's stay."""
    for domain in ("met", "radio_browser", "shopping_list"):
        # Stand-ins: the real ones need their PyPI requirements to unload.
        mock_integration(hass, MockModule(domain))
    unsubscribe = load_dev_helper().remove_failed_online_only_entries(hass)
    failing = MockConfigEntry(domain="met", source="onboarding", title="Home")
    users = MockConfigEntry(domain="met", source="user", title="Cabin")
    working = MockConfigEntry(domain="radio_browser", source="onboarding")
    other = MockConfigEntry(domain="shopping_list", source="onboarding")
    for entry, state in (
        (failing, ConfigEntryState.SETUP_RETRY),
        (users, ConfigEntryState.SETUP_RETRY),
        (working, ConfigEntryState.LOADED),
        (other, ConfigEntryState.SETUP_ERROR),
    ):
        entry.add_to_hass(hass)
        entry.mock_state(hass, state)
        async_dispatcher_send(
            hass, SIGNAL_CONFIG_ENTRY_CHANGED, ConfigEntryChange.UPDATED, entry
        )
    await hass.async_block_till_done()
    remaining = {e.entry_id for e in hass.config_entries.async_entries()}
    assert remaining == {users.entry_id, working.entry_id, other.entry_id}
    unsubscribe()


async def test_a_demo_picture_that_cannot_be_fetched_is_just_missing(
    hass: HomeAssistant, aioclient_mock: AiohttpClientMocker
) -> None:
    """Offline the image proxy's fetch fails: no exception (no traceback), no image."""
    url = "https://img.youtube.com/vi/eyU3bRy2x44/hqdefault.jpg"
    aioclient_mock.get(url, exc=aiohttp.ClientConnectionError("offline"))
    with patch(
        "homeassistant.components.demo.COMPONENTS_WITH_CONFIG_ENTRY_DEMO_PLATFORM",
        [Platform.MEDIA_PLAYER],
    ):
        assert await async_setup_component(hass, "demo", {"demo": {}})
        await hass.async_block_till_done()
    player = hass.data[DATA_COMPONENT].get_entity("media_player.living_room")
    assert player is not None and player.media_image_url == url
    load_dev_helper().quiet_demo_pictures(hass)
    assert await player.async_get_media_image() == (None, None)


def ha_requirements(*domains: str) -> set[str]:
    """Run the Python of scripts/setup's ``ha_requirements`` for ``domains``."""
    function = SETUP.read_text().split("ha_requirements() {", 1)[1]
    code = function.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    listed = subprocess.run(
        [sys.executable, "-", *domains],
        input=code,
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    return set(listed.split())


def test_develop_preinstalls_what_adding_an_esphome_device_sets_up() -> None:
    """The requirements of dhcp and mqtt come with esphome's.

    Adding an ESPHome device (scripts/satellite, a first satellite) sets up dhcp and
    mqtt, whose matchers esphome's manifest has. Home Assistant then pip-installed
    their requirements (offline that fails), and aiodiscover pulled pycares 5, on
    which HA's aiodns breaks every DNS lookup: a traceback per demo picture on every
    dashboard load.
    """
    listed = ha_requirements("esphome", "wyoming")
    for domain in ("dhcp", "mqtt", "zeroconf"):
        manifest = json.loads((COMPONENTS / domain / "manifest.json").read_text())
        assert set(manifest["requirements"]) <= listed, domain


def test_integration_requirements_keep_the_test_environments_pins() -> None:
    """requirements_test.txt constrains what scripts/setup installs for integrations."""
    function = SETUP.read_text().split("install_ha_requirements() {", 1)[1]
    assert '-c "$RTVOICE_REQUIREMENTS"' in function.split("\n}\n", 1)[0]
    pins = {}
    for line in REQUIREMENTS_TEST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)  # a constraints file: names and versions
            assert not requirement.extras and not requirement.url, line
            pins[requirement.name] = requirement.specifier
    assert not pins["pycares"].contains("5.0.0")
