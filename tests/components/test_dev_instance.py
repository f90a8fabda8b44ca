"""The development instance (scripts/develop, config/) behaves like a stock install.

Issue 12 items 16 and 17: the configuration loads automations, scripts and scenes
made in the UI from the files a stock installation has, and the dev helper gives the
preferred Assist pipeline speech engines that work offline.
"""

from __future__ import annotations

from pathlib import Path
import shutil
import subprocess

from homeassistant import config as conf_util
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "config"
DEVELOP = ROOT / "scripts" / "develop"

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
