"""Prompt sections: DESIGN 4.7 and the system message of every request."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.kernel import PromptRegistry, PromptSection
from tests.kernel.fakes import Rig, ScriptedProvider, Text, outcome


def sec(
    section: str,
    content: str,
    *,
    order: int = 0,
    scope: str | None = None,
    owner: str | None = None,
    volatile: bool = False,
) -> PromptSection:
    """Build a prompt section; the owner defaults to the name's prefix."""
    return PromptSection(
        section=section,
        owner=owner if owner is not None else section.split(".", 1)[0],
        content=content,
        order=order,
        volatile=volatile,
        scope=scope,
    )


@pytest.mark.parametrize(
    ("section", "owner"),
    [
        ("noname", "noname"),  # no dot
        ("sat.", "sat"),  # empty name
        (".name", ""),  # empty owner
        ("other.name", "sat"),  # prefix is not the owner
        ("", "sat"),
    ],
)
def test_bad_section_name_raises_value_error(section: str, owner: str) -> None:
    """Bad section name raises value error."""
    reg = PromptRegistry()
    with pytest.raises(ValueError):
        reg.declare(PromptSection(section=section, owner=owner, content="text"))
    assert reg.snapshot() == []


def test_declare_again_overwrites() -> None:
    """Declare again overwrites."""
    reg = PromptRegistry()
    reg.declare(sec("sat.area", "Area: kitchen"))
    reg.declare(sec("sat.area", "Area: hall"))
    snap = reg.snapshot()
    assert [s.section for s in snap] == ["sat.area"]
    assert snap[0].content == "Area: hall"
    assert reg.render() == "Area: hall"


def test_empty_content_removes() -> None:
    """Empty content removes."""
    reg = PromptRegistry()
    reg.declare(sec("sat.area", "Area: kitchen"))
    reg.declare(sec("sat.other", "Other"))
    reg.declare(sec("sat.area", ""))
    assert [s.section for s in reg.snapshot()] == ["sat.other"]


def test_remove_and_remove_owner() -> None:
    """Remove and remove owner."""
    reg = PromptRegistry()
    reg.declare(sec("sat.a", "A"))
    reg.declare(sec("sat.b", "B"))
    reg.declare(sec("led.c", "C"))
    reg.remove("sat.a")
    assert [s.section for s in reg.snapshot()] == ["led.c", "sat.b"]
    reg.remove("does.not-exist")  # harmless
    reg.remove_owner("sat")
    assert [s.section for s in reg.snapshot()] == ["led.c"]
    reg.remove_owner("led")
    assert reg.snapshot() == []
    assert reg.render() == ""


def test_snapshot_and_render_sort_by_order_then_name_joined_by_blank_line() -> None:
    """Snapshot and render sort by order then name joined by blank line."""
    reg = PromptRegistry()
    reg.declare(sec("zeta.x", "Z", order=0))
    reg.declare(sec("alpha.x", "A", order=0))
    reg.declare(sec("late.x", "L", order=10))
    reg.declare(sec("early.x", "E", order=-5))
    assert [s.section for s in reg.snapshot()] == [
        "early.x",
        "alpha.x",
        "zeta.x",
        "late.x",
    ]
    assert reg.render() == "E\n\nA\n\nZ\n\nL"


def test_render_scope_filtering() -> None:
    """Render scope filtering."""
    reg = PromptRegistry()
    reg.declare(sec("global.rules", "Global rules", order=0))
    reg.declare(sec("sat1.area", "Kitchen satellite", order=1, scope="sat1"))
    reg.declare(sec("sat2.area", "Hall satellite", order=1, scope="sat2"))
    assert reg.render() == "Global rules"
    assert reg.render("sat1") == "Global rules\n\nKitchen satellite"
    assert reg.render("sat2") == "Global rules\n\nHall satellite"
    assert reg.render("sat3") == "Global rules"


def test_volatile_flag_is_kept() -> None:
    """Volatile flag is kept."""
    reg = PromptRegistry()
    reg.declare(sec("media.now", "Playing: jazz", volatile=True))
    assert reg.snapshot()[0].volatile is True


# --------------------------------------------------------------------------- children


async def test_system_message_is_prompt_plus_sections_of_the_child() -> None:
    """System message is prompt plus sections of the child."""
    prompts = PromptRegistry()
    prompts.declare(sec("global.rules", "GLOBAL-RULES"))
    prompts.declare(sec("sat1.area", "AREA-KITCHEN", order=5, scope="sat1"))
    prompts.declare(sec("sat2.area", "AREA-HALL", order=5, scope="sat2"))
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider, prompts=prompts) as rig:
        await rig.spawn("c1", system_prompt="YOU ARE A VOICE", prompt_scope="sat1")
        await outcome(rig.kernel.push("c1", "hi"))
        system = provider.calls[0].messages[0]
        assert system.role == "system"
        assert system.content.startswith("YOU ARE A VOICE")
        assert system.content.endswith(prompts.render("sat1"))
        assert "AREA-HALL" not in system.content
        assert system.content.index("GLOBAL-RULES") < system.content.index(
            "AREA-KITCHEN"
        )
        assert sum(1 for m in provider.calls[0].messages if m.role == "system") == 1


async def test_empty_system_prompt_uses_the_default_realtime_prompt() -> None:
    """Empty system prompt uses the default realtime prompt."""
    prompts = PromptRegistry()
    prompts.declare(sec("global.rules", "GLOBAL-RULES"))
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider, prompts=prompts) as rig:
        await rig.spawn("a")
        await rig.spawn("b", system_prompt="   ")
        await outcome(rig.kernel.push("a", "hi"))
        await outcome(rig.kernel.push("b", "hi"))
        sys_a = provider.calls[0].messages[0].content
        sys_b = provider.calls[1].messages[0].content
        assert sys_a == sys_b
        assert sys_a.endswith("GLOBAL-RULES")
        default = sys_a[: -len("GLOBAL-RULES")].strip()
        assert default  # not empty: a default realtime prompt precedes the sections
        assert "interrupt" in default.lower()


async def test_section_updates_apply_at_the_next_round() -> None:
    """Section updates apply at the next round."""
    prompts = PromptRegistry()
    prompts.declare(sec("sat1.media", "Playing: nothing", scope="sat1"))
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider, prompts=prompts) as rig:
        await rig.spawn("c1", system_prompt="P", prompt_scope="sat1")
        await outcome(rig.kernel.push("c1", "one"))
        prompts.declare(sec("sat1.media", "Playing: jazz", scope="sat1"))
        prompts.declare(sec("global.time", "It is noon."))
        await outcome(rig.kernel.push("c1", "two"))
        prompts.remove_owner("sat1")
        await outcome(rig.kernel.push("c1", "three"))

        s1, s2, s3 = (c.messages[0].content for c in provider.calls)
        assert "Playing: nothing" in s1 and "jazz" not in s1
        assert "Playing: jazz" in s2 and "It is noon." in s2
        assert "Playing" not in s3 and "It is noon." in s3


async def test_without_registry_system_message_is_the_prompt() -> None:
    """Without registry system message is the prompt."""
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider) as rig:
        await rig.spawn("c1", system_prompt="ONLY THIS")
        await outcome(rig.kernel.push("c1", "hi"))
        assert provider.calls[0].messages[0].content.strip() == "ONLY THIS"
