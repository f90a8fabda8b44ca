"""An emulated ESPHome voice satellite for tests and scripts (no hardware).

The real ``aioesphomeapi`` client (and so Home Assistant's ``esphome`` integration)
connects to it over 127.0.0.1, plaintext or Noise::

    async with EmulatedDevice(name="kitchen", encrypted=True, speed=1.0) as device:
        client = APIClient(device.host, device.port, None, noise_psk=device.noise_psk)
        await client.connect(login=True)
        ...                                   # client subscribes to the voice assistant
        await device.wait_for_voice_client()
        run = device.say(speak("turn on the kitchen lights"))   # wake word + speech
        await device.wait_for_event(EventType.TTS_END)
        await run.ended.wait()                # answer fetched and played
        device.playbacks[-1].bytes, device.events  # what the device heard and did

Behaviour taken from the firmware source, worth knowing when writing tests:

- ``say``/``wake`` while a run is going follow stock Voice PE (``Interrupt.FIRMWARE``):
  ignored mid-run (they return None), and while the answer plays they only stop it.
  ``Interrupt.RESTART`` sends a new start request anyway (not stock behaviour).
- Send pipeline events only once ``run.streaming`` is set: a ``VoiceAssistantResponse``
  that arrives after an event moved the state on is refused with ``start=False``.
- A ``RUN_END`` arriving while a run is starting or streaming ends that run, whichever
  pipeline it came from (a stale one from a cancelled run included).
- ``run.ended`` is set when the device is done with the run: after the answer played,
  or at ``RUN_END`` without an answer, an error, an abort, a disconnect.

Modules: ``framing`` (plaintext + Noise), ``connection`` (one API client, answered as
the firmware's ``APIConnection``), ``voice`` (the firmware's voice assistant state
machine) with ``runs`` (its vocabulary: event types, states, ``Run``), ``mic`` (paced
32 ms frames), ``speaker`` (HTTP fetch + playback record), ``record`` (timestamped
record, event-driven waits), ``timeline`` (scripts), ``device`` (the server and the
public API), ``config`` (identity and features), ``i2s`` (the firmware's speaker path:
16 KiB voice-assistant buffer, I2S ring, DMA, bus lock; what was heard, sample-timed),
``profiles`` (the satellites people own: ``EmulatedDevice(profile="atom-echo")``).
"""

from .config import (
    ATOM_ECHO_FEATURES,
    VOICE_PE_FEATURES,
    DeviceConfig,
    Feature,
    MediaFormat,
    WakeWord,
)
from .device import EmulatedDevice
from .i2s import Played, SpeakerPath
from .mic import FRAME_BYTES, FRAME_SECONDS, SAMPLE_RATE
from .profiles import PROFILE_NAMES, PROFILES, profile
from .record import Entry, Kind, Record
from .runs import EventType, Interrupt, Run, State
from .speaker import AudioFormat, Playback
from .timeline import (
    Abort,
    Drop,
    EndUtterance,
    Say,
    ScriptResult,
    WaitEvent,
    Wake,
    run_script,
)

__all__ = [
    "ATOM_ECHO_FEATURES",
    "FRAME_BYTES",
    "FRAME_SECONDS",
    "PROFILES",
    "PROFILE_NAMES",
    "SAMPLE_RATE",
    "VOICE_PE_FEATURES",
    "Abort",
    "AudioFormat",
    "DeviceConfig",
    "Drop",
    "EmulatedDevice",
    "EndUtterance",
    "Entry",
    "EventType",
    "Feature",
    "Interrupt",
    "Kind",
    "MediaFormat",
    "Playback",
    "Played",
    "Record",
    "Run",
    "Say",
    "ScriptResult",
    "SpeakerPath",
    "State",
    "WaitEvent",
    "Wake",
    "WakeWord",
    "profile",
    "run_script",
]
