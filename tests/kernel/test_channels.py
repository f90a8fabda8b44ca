"""Channel registry and RT binding contracts (DESIGN 4.1, spawn errors of 4.9)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from custom_components.rtvoice.kernel import (
    AgentNotRealtimeError,
    Capability,
    ChannelDef,
    ChannelNotRealtimeError,
    ChannelRegistry,
    ChannelsNotPairedError,
    ChannelUnknownError,
    ChildOptions,
    KernelError,
)
from tests.kernel.fakes import Rig, ScriptedProvider, Text, outcome


def _noop(delta: str) -> None:
    del delta


# --------------------------------------------------------------------------- registry


def test_register_input_capabilities_follow_definition() -> None:
    """Register input capabilities follow definition."""
    reg = ChannelRegistry()
    reg.register_input("plain")
    reg.register_input("rt", ChannelDef(realtime=True, no_memory=True))

    plain = reg.lookup("plain")
    rt = reg.lookup("rt")
    assert plain is not None and rt is not None
    assert plain.kind == "input" and rt.kind == "input"
    assert plain.name == "plain"
    assert Capability.TEXT in plain.capabilities
    assert Capability.RT not in plain.capabilities
    assert Capability.RT in rt.capabilities
    assert rt.definition == ChannelDef(realtime=True, no_memory=True)
    assert rt.definition.no_memory is True


def test_register_output_adds_rt_when_definition_is_realtime() -> None:
    """Register output adds rt when definition is realtime."""
    reg = ChannelRegistry()
    reg.register_output("speaker", _noop)
    reg.register_output("rt-speaker", _noop, definition=ChannelDef(realtime=True))
    reg.register_output("audio", _noop, capabilities=Capability.TEXT | Capability.AUDIO)

    speaker = reg.lookup("speaker")
    rt_speaker = reg.lookup("rt-speaker")
    audio = reg.lookup("audio")
    assert speaker is not None and rt_speaker is not None and audio is not None
    assert speaker.kind == "output"
    assert Capability.RT not in speaker.capabilities
    assert Capability.TEXT in speaker.capabilities
    # RT is added on top of the declared capabilities, TEXT is kept.
    assert Capability.RT in rt_speaker.capabilities
    assert Capability.TEXT in rt_speaker.capabilities
    assert Capability.AUDIO in audio.capabilities
    assert Capability.RT not in audio.capabilities


def test_lookup_list_and_unregister() -> None:
    """Lookup list and unregister."""
    reg = ChannelRegistry()
    assert reg.lookup("missing") is None
    reg.register_input("a")
    reg.register_output("b", _noop)
    assert sorted(c.name for c in reg.list()) == ["a", "b"]

    reg.unregister("a")
    assert reg.lookup("a") is None
    assert [c.name for c in reg.list()] == ["b"]


def test_plain_assign_sets_owner_and_unknown_raises() -> None:
    """Plain assign sets owner and unknown raises."""
    reg = ChannelRegistry()
    reg.register_input("a")
    reg.assign("a", "someone")
    ch = reg.lookup("a")
    assert ch is not None and ch.owner == "someone"

    with pytest.raises(ChannelUnknownError):
        reg.assign("nope", "someone")


def test_error_types_are_distinct_kernel_errors() -> None:
    """Error types are distinct kernel errors."""
    types = {
        ChannelUnknownError,
        ChannelNotRealtimeError,
        AgentNotRealtimeError,
        ChannelsNotPairedError,
    }
    assert len(types) == 4
    for t in types:
        assert issubclass(t, KernelError)
        others = types - {t}
        assert not any(issubclass(t, o) for o in others)


# --------------------------------------------------------------------------- RT binding


async def test_spawn_binds_both_rt_channels_to_the_child() -> None:
    """Spawn binds both rt channels to the child."""
    async with Rig() as rig:
        await rig.spawn("c1")
        inp = rig.channels.lookup("c1-in")
        out = rig.channels.lookup("c1-out")
        assert inp is not None and out is not None
        assert inp.owner == "c1"
        assert out.owner == "c1"
        assert rig.kernel.children() == ["c1"]


async def test_non_rt_channel_can_be_given_to_a_realtime_child_by_plain_assign() -> (
    None
):
    """Non rt channel can be given to a realtime child by plain assign."""
    async with Rig() as rig:
        await rig.spawn("c1")
        rig.channels.register_input("file")  # ordinary, not RT
        rig.channels.assign("file", "c1")
        ch = rig.channels.lookup("file")
        assert ch is not None and ch.owner == "c1"
        assert Capability.RT not in ch.capabilities


async def test_failed_binding_rolls_back_to_previous_owners() -> None:
    """Failed binding rolls back to previous owners."""
    async with Rig() as rig:
        rig.channels.register_input("in", ChannelDef(realtime=True))
        rig.channels.register_output("out", _noop)  # NOT realtime: second side fails
        rig.channels.assign("in", "prev-in-owner")
        rig.channels.assign("out", "prev-out-owner")

        with pytest.raises(ChannelNotRealtimeError):
            await rig.kernel.spawn(ChildOptions(id="c1", input="in", output="out"))

        inp = rig.channels.lookup("in")
        out = rig.channels.lookup("out")
        assert inp is not None and out is not None
        assert inp.owner == "prev-in-owner"  # previous value, not "unassigned"
        assert out.owner == "prev-out-owner"
        assert rig.kernel.children() == []
        assert rig.kernel.stats("c1") is None
        with pytest.raises(KernelError):
            rig.kernel.push("c1", "hello")


async def test_failed_binding_on_unknown_output_rolls_back_input_owner() -> None:
    """Failed binding on unknown output rolls back input owner."""
    async with Rig() as rig:
        rig.channels.register_input("in", ChannelDef(realtime=True))
        rig.channels.assign("in", "prev")
        with pytest.raises(ChannelUnknownError):
            await rig.kernel.spawn(ChildOptions(id="c1", input="in", output="ghost"))
        inp = rig.channels.lookup("in")
        assert inp is not None and inp.owner == "prev"
        assert rig.kernel.children() == []


async def test_failed_binding_on_non_rt_input_leaves_output_untouched() -> None:
    """Failed binding on non rt input leaves output untouched."""
    async with Rig() as rig:
        rig.channels.register_input("in")  # not RT
        rig.channels.register_output("out", _noop, definition=ChannelDef(realtime=True))
        rig.channels.assign("out", "prev")
        with pytest.raises(ChannelNotRealtimeError):
            await rig.kernel.spawn(ChildOptions(id="c1", input="in", output="out"))
        out = rig.channels.lookup("out")
        inp = rig.channels.lookup("in")
        assert out is not None and out.owner == "prev"
        assert inp is not None and inp.owner != "c1"


async def test_unknown_input_channel_error_names_the_channel() -> None:
    """Unknown input channel error names the channel."""
    async with Rig() as rig:
        rig.pair("sat")
        with pytest.raises(ChannelUnknownError) as info:
            await rig.kernel.spawn(
                ChildOptions(id="c1", input="no-such-input", output="sat-out")
            )
        assert "no-such-input" in str(info.value)
        out = rig.channels.lookup("sat-out")
        assert out is not None and out.owner != "c1"


@pytest.mark.parametrize(("inp", "out"), [("", "sat-out"), ("sat-in", "")])
async def test_missing_half_is_not_paired_and_lists_rt_channels(
    inp: str, out: str
) -> None:
    """Missing half is not paired and lists rt channels."""
    async with Rig() as rig:
        rig.pair("sat")
        with pytest.raises(ChannelsNotPairedError) as info:
            await rig.kernel.spawn(ChildOptions(id="c1", input=inp, output=out))
        # The create error lists which RT channels exist (DESIGN 4.8).
        message = str(info.value)
        assert "sat-in" in message
        assert "sat-out" in message
        for name in ("sat-in", "sat-out"):
            ch = rig.channels.lookup(name)
            assert ch is not None and ch.owner != "c1"
        assert rig.kernel.children() == []


async def test_input_and_output_must_be_one_input_and_one_output() -> None:
    """Input and output must be one input and one output."""
    async with Rig() as rig:
        rig.pair("a")
        rig.pair("b")
        # two outputs, no input: not a pair
        with pytest.raises(KernelError):
            await rig.kernel.spawn(ChildOptions(id="c1", input="b-out", output="a-out"))
        for name in ("a-out", "b-out"):
            ch = rig.channels.lookup(name)
            assert ch is not None and ch.owner != "c1"
        assert rig.kernel.children() == []


async def test_duplicate_child_id_is_refused() -> None:
    """Duplicate child id is refused."""
    async with Rig() as rig:
        await rig.spawn("c1")
        rig.pair("other")
        with pytest.raises(KernelError):
            await rig.kernel.spawn(
                ChildOptions(id="c1", input="other-in", output="other-out")
            )
        assert rig.kernel.children() == ["c1"]
        ch = rig.channels.lookup("other-in")
        assert ch is not None and ch.owner != "c1"


async def test_failed_spawn_leaves_no_task_behind() -> None:
    """Failed spawn leaves no task behind."""
    before = asyncio.all_tasks()
    async with Rig() as rig:
        rig.channels.register_input("in", ChannelDef(realtime=True))
        rig.channels.register_output("out", _noop)
        with pytest.raises(ChannelNotRealtimeError):
            await rig.kernel.spawn(ChildOptions(id="c1", input="in", output="out"))
        assert asyncio.all_tasks() - before == set()


# --------------------------------------------------------------------------- dangling


async def test_channels_dangle_after_stop(caplog: pytest.LogCaptureFixture) -> None:
    """Channels dangle after stop."""
    caplog.set_level(logging.DEBUG)
    async with Rig(ScriptedProvider(default=[Text("hi")])) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "hello"))
        caplog.clear()
        await rig.kernel.stop("c1")

        inp = rig.channels.lookup("c1-in")
        out = rig.channels.lookup("c1-out")
        assert inp is not None and out is not None
        # Not handed back: still pointing at the dead child (visible).
        assert inp.owner == "c1"
        assert out.owner == "c1"
        assert "c1" not in rig.kernel.children()
        # ... and logged.
        assert any(
            "c1-in" in r.getMessage() or "c1-out" in r.getMessage()
            for r in caplog.records
        )
        with pytest.raises(KernelError):
            rig.kernel.push("c1", "again")


async def test_push_to_unknown_child_raises() -> None:
    """Push to unknown child raises."""
    async with Rig() as rig:
        with pytest.raises(KernelError):
            rig.kernel.push("ghost", "hello")
        assert rig.kernel.stats("ghost") is None
        assert rig.kernel.transcript("ghost") is None
