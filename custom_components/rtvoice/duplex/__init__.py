"""The duplex core of Realtime Voice: pure asyncio and audio, no Home Assistant imports.

Mic frames in, sentences of the answer out as paced audio frames, barge-in by voice.
DESIGN §5.5; shared by the ESPHome and Wyoming adapters.
"""
