"""Conversations: one kernel child each, routed by satellite, device or id.

A *session* is one realtime child of the entry's kernel (its id is the conversation
id handed to Home Assistant). This package keeps routing, the lifecycle of
sessions, carry-over and the idle timer; HA's chat log is written by ``chat_feed``
and the control plane (actions, the control LLM API) lives in ``control``.

- ``manager``: ``SessionManager``, what the conversation entity, the control plane
  and the kernel's callbacks call: a turn is routed, pushed and answered here.
- ``routing``: which session a turn belongs to (keys, aliases, barge-in ids, the
  Assist dialog's id-less turns) and the per-key routing locks.
- ``lifecycle``: spawn, input, output handlers, the idle timer and the one
  teardown of a session.
- ``session``: one session's state and what its output does to it.

Imports go one way: manager → lifecycle → routing → session.
"""

from .lifecycle import ConversationSettings
from .manager import SessionManager
from .session import Conversation, DuplexHandle

__all__ = ["Conversation", "ConversationSettings", "DuplexHandle", "SessionManager"]
