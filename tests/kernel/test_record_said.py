"""Words the assistant said outside a round (``Kernel.record_said``).

An adapter that spoke for the assistant itself (the announcement that opened a
conversation) records it, so the model's next request shows what it asked.
"""

from __future__ import annotations

import asyncio

from tests.kernel.fakes import Rig, ScriptedProvider, Text, WaitFor, outcome


async def test_said_before_the_first_round_is_an_assistant_message() -> None:
    """Recorded while idle: the next request has it before the user's reply."""
    provider = ScriptedProvider(default=[Text("Great.")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        assert rig.kernel.record_said("c1", "Shall I close the blinds?")
        await outcome(rig.kernel.push("c1", "yes please"))
        sent = provider.calls[-1].messages
        assert [(m.role, m.content) for m in sent[1:]] == [
            ("assistant", "Shall I close the blinds?"),
            ("user", "yes please"),
        ]
        assert rig.kernel.transcript_page("c1").splitlines() == [
            "[assistant] Shall I close the blinds?",
            "[user] yes please",
            "[assistant] Great.",
        ]


async def test_not_recorded_while_a_round_runs_or_for_unknown_children() -> None:
    """A running round (or an empty text, an unknown child) records nothing."""
    release = asyncio.Event()
    provider = ScriptedProvider(default=[Text("one "), WaitFor(release), Text("two")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "count")
        assert not rig.kernel.record_said("c1", "pending input")  # not yet taken
        await out.wait_text("one ")
        assert not rig.kernel.record_said("c1", "mid-round")
        release.set()
        await outcome(ticket)
        assert not rig.kernel.record_said("c1", "  ")
        assert not rig.kernel.record_said("ghost", "hello")
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [m.content for m in transcript] == ["count", "one two"]
