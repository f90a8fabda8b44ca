"""scripts/check_ha_names.py on a tiny synthetic Home Assistant wheel (no network)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
import subprocess
import sys
from types import ModuleType
from typing import Any
import zipfile

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_ha_names.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_ha_names", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


chk = _load()

WHEEL_FILES = {
    "homeassistant/__init__.py": "",
    "homeassistant/const.py": """
from typing import TYPE_CHECKING
from functools import partial
import enum, os.path as osp

if TYPE_CHECKING:
    from typing import Hidden
else:
    Visible = 1

try:
    import tomllib
except ImportError:
    FALLBACK = 1
else:
    OTHERWISE = 2
finally:
    FINALLY = 3

with open(__file__) as _f:
    WITH_NAME = 1

X = 1
A, (B, *C) = 1, (2, 3)
ANNOTATED: int = 3
_DEPRECATED_OLD = ("OLD", 1, "2030.1")
type Alias = int
__getattr__ = partial(print)
__all__ = ["X"]
""",
    "homeassistant/helpers/__init__.py": "",
    "homeassistant/helpers/llm.py": """
from .sub import *
from .exported import *

class Tool:
    pass

async def async_get_api():
    pass
""",
    "homeassistant/helpers/sub.py": "Reexported = 1\n_private = 2\n",
    "homeassistant/helpers/exported.py": (
        "__all__ = ['Listed']\n__all__ += ['Added']\n"
        "Listed = 1\nAdded = 2\nNotListed = 3\n"
    ),
    "homeassistant/helpers/deep.py": "from .llm import *\n",
    "homeassistant/components/conversation/__init__.py": """
from .chat_log import ChatLog
from . import models

def probe():
    try:
        pass
    except KeyError, IndexError:
        pass
""",
    "homeassistant/components/conversation/chat_log.py": "class ChatLog:\n    pass\n",
    "homeassistant/components/conversation/models.py": "Model = 1\n",
    # Python 3.14 template strings: this Python cannot parse the file at all.
    "homeassistant/components/tts/__init__.py": (
        "from .media import (\n    Media,\n    Other as Renamed,\n)\n"
        "from ..conversation import *\n"
        "import json, os.path as osp\n"
        "import logging\n"
        'GREETING = t"hello {name}"\n'
        "type Voice = str\n"
        "async def async_speak():\n    pass\n"
        "class ResultStream:\n    pass\n"
        "LIMIT: int = 3\n"
    ),
    "homeassistant/components/tts/media.py": "Media = 1\nOther = 2\n",
    "homeassistant/py.typed": "",
}

CLEAN_COMPONENT = """
from homeassistant.const import X, Visible, FALLBACK, OTHERWISE, FINALLY, WITH_NAME
from homeassistant.const import A, B, C, ANNOTATED, Alias, enum, osp
from homeassistant.helpers import llm
from homeassistant.helpers.llm import Reexported, Listed, Added
from homeassistant.helpers.deep import Tool
from homeassistant.components import conversation, tts
import homeassistant.helpers.llm as llm2
import homeassistant.components.conversation
from .local import thing
import json

llm.Tool
llm.async_get_api()
llm2.Tool.attr.deeper
conversation.ChatLog
conversation.chat_log.ChatLog
conversation.models.Model
tts.ResultStream, tts.Media, tts.Renamed, tts.GREETING, tts.Voice, tts.LIMIT
tts.async_speak, tts.json, tts.osp, tts.logging
homeassistant.components.conversation.ChatLog
json.dumps
thing.x
"""

BROKEN_COMPONENT = """
from homeassistant.const import X, GONE, OLD, Hidden
from homeassistant.const import LATER  # compat: optional
from homeassistant.helpers import llm
from homeassistant.helpers.llm import NotListed, _private
from homeassistant.helpers.deep import Reexported
import homeassistant.nothere
from homeassistant.missing_module import Anything

try:
    from homeassistant.components.tts import Future
except ImportError:
    Future = None

llm.Tool
llm.Vanished
llm.Vanished
homeassistant.components.conversation.Nope
"""


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    """Build a wheel holding the synthetic homeassistant package."""
    path = tmp_path / "homeassistant-2099.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in WHEEL_FILES.items():
            archive.writestr(name, text)
    return path


def _component(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "custom_components" / "demo"
    (folder / "kernel").mkdir(parents=True)
    (folder / "kernel" / "core.py").write_text("import asyncio\n")
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def test_clean_component_passes(
    wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Names, re-exports, submodules and attribute chains that exist pass."""
    component = _component(tmp_path, good=CLEAN_COMPONENT)
    assert chk.main(["--wheel", str(wheel), "--component", str(component)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("homeassistant 2099.1.0: ")
    assert "MISSING" not in out
    assert "homeassistant/components/tts/__init__.py needs a newer Python" in out
    assert "every homeassistant name the component uses exists" in out


def test_missing_names_are_reported(
    wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Missing modules and names fail; guarded ones and deprecated ones do not."""
    component = _component(tmp_path, bad=BROKEN_COMPONENT)
    assert chk.main(["--wheel", str(wheel), "--component", str(component)]) == 1
    out = capsys.readouterr().out
    missing = out.split("MISSING:\n")[1].split("\n\n")[0]
    reported = {
        line.split()[0] for line in missing.splitlines() if line.startswith("  ")
    }
    assert reported == {
        "homeassistant.const.GONE",
        "homeassistant.const.Hidden",  # only defined for type checkers
        "homeassistant.helpers.llm.NotListed",  # not in the star module's __all__
        "homeassistant.helpers.llm._private",  # star imports skip private names
        "homeassistant.helpers.deep.Reexported",  # two levels of re-exports away
        "homeassistant.nothere",
        "homeassistant.missing_module",
        "homeassistant.helpers.llm.Vanished",
        "homeassistant.components.conversation.Nope",
    }
    assert "9 missing name(s)" in out
    optional = out.split("optional (version-guarded) names absent:\n")[1]
    assert "homeassistant.const.LATER" in optional.split("deprecated")[0]
    assert "homeassistant.components.tts.Future" in optional.split("deprecated")[0]
    deprecated = out.split("deprecated names (still served, will go away):\n")[1]
    assert deprecated.splitlines()[0].split()[0] == "homeassistant.const.OLD"
    bad = component / "bad.py"
    assert f"homeassistant.helpers.llm.Vanished  ({bad}:16, {bad}:17)" in out
    assert out.count("homeassistant.helpers.llm.Vanished") == 1


def test_uses_in_source() -> None:
    """Imports, aliases and attribute chains are found with their lines."""
    uses, chains = chk.uses_in_source(
        "import homeassistant.helpers.llm as l\n"
        "from homeassistant.helpers import device_registry as dr\n"
        "try:\n"
        "    from homeassistant.x import y\n"
        "except (ValueError, ModuleNotFoundError):\n"
        "    pass\n"
        "try:\n"
        "    from homeassistant.z import w\n"
        "except ValueError:\n"
        "    pass\n"
        "dr.DeviceInfo(x=l.Tool)\n",
        "f.py",
    )
    assert [(u.label, u.where, u.optional) for u in uses] == [
        ("homeassistant.helpers.llm", "f.py:1", False),
        ("homeassistant.helpers", "f.py:2", False),
        ("homeassistant.helpers.device_registry", "f.py:2", False),
        ("homeassistant.x", "f.py:4", True),
        ("homeassistant.x.y", "f.py:4", True),
        ("homeassistant.z", "f.py:8", False),
        ("homeassistant.z.w", "f.py:8", False),
    ]
    assert {(c.module, c.attrs, c.where) for c in chains} == {
        ("homeassistant.helpers.device_registry", ("DeviceInfo",), "f.py:11"),
        ("homeassistant.helpers.llm", ("Tool",), "f.py:11"),
    }


def test_parse_newer_rewrites_bare_exception_tuples() -> None:
    """PEP 758 except clauses parse; other unknown syntax gives None."""
    tree = chk.parse_newer("try:\n    pass\nexcept* A, b.C:\n    pass\n", "x.py")
    assert tree is not None
    if sys.version_info < (3, 14):
        assert chk.parse_newer('X = t"{y}"\n', "x.py") is None


def test_download_failure_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a wheel the check cannot run: exit code 2 and a message."""

    def fail(target: Path, version: str | None) -> Path:
        raise subprocess.CalledProcessError(1, ["pip"])

    monkeypatch.setattr(chk, "download_wheel", fail)
    assert chk.main(["--version", "1.0"]) == 2
    assert "could not download" in capsys.readouterr().err


def test_download_uses_pypi_version_and_pip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The newest version from PyPI's metadata is pinned in the pip command."""
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        (tmp_path / "homeassistant-2099.1.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(
            command, 0, "", "WARNING: Location 'file:///x' is ignored\n"
        )

    monkeypatch.setattr(chk, "_newest_on_pypi", lambda: ("2099.1.0", "3.14.2"))
    monkeypatch.setattr(chk.subprocess, "run", fake_run)
    wheel = chk.download_wheel(tmp_path, None)
    assert wheel.name == "homeassistant-2099.1.0-py3-none-any.whl"
    command = calls[0]
    assert "homeassistant==2099.1.0" in command
    assert command[command.index("--python-version") + 1] == "3.14.2"
    assert "--no-deps" in command and "--only-binary=:all:" in command

    # Without PyPI's metadata: the newest wheel for any Python, unpinned.
    calls.clear()
    monkeypatch.setattr(chk, "_newest_on_pypi", lambda: None)
    chk.download_wheel(tmp_path, None)
    assert "homeassistant" in calls[0]
    assert calls[0][calls[0].index("--python-version") + 1] == chk.ANY_FUTURE_PYTHON
