"""Wyoming satellites in Home Assistant: probing, the links, the repair.

- ``async_probe_wyoming`` tests a satellite before its subentry flow (or a
  discovery) stores it: ``describe`` → ``info`` must show a satellite;
- ``WyomingSatellites`` runs one ``WyomingSatelliteLink`` per stored satellite on the
  entry's kernel, with the STT and TTS of the pipeline chosen in the satellite's
  pipeline select (``duplex_ha``; the preferred one by default), the satellite's
  own settings (barge-in, end silence, wake word) and the entry's conversation
  settings (``duplex_ha.satellite_binding``, as for ESPHome), indexes its
  conversations with the ``SessionManager`` (listed, sent to, stopped and read
  like any other), tells the satellite entities (a dispatcher signal) when a
  link or its session changes, and stores a satellite's changed settings
  (``async_store``: the satellite's subentry; the entry reloads). ``async_stop`` leaves no task;
- while it runs, a repair issue says when HA's ``wyoming`` integration holds the
  same satellite (same host and port): a satellite serves one client at a time.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
import dataclasses
import functools
import logging
import time
from typing import Any, Final

from wyoming.info import Describe, Info

from homeassistant.components.assist_pipeline.select import get_chosen_pipeline
from homeassistant.config_entries import (
    SIGNAL_CONFIG_ENTRY_CHANGED,
    ConfigEntry,
    ConfigEntryChange,
)
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import device_registry as dr, issue_registry as ir
from homeassistant.helpers.dispatcher import (
    async_dispatcher_connect,
    async_dispatcher_send,
)

from .audio.wakeword import MODELS_BY_ID, WakeWordEngine, WakeWordUnavailableError
from .const import (
    CONF_NAME,
    CONF_WAKE_WORD,
    DEFAULT_WYOMING_PORT,
    DOMAIN,
    SUBENTRY_WYOMING,
)
from .duplex import SessionState
from .duplex_ha import satellite_binding, satellite_device_id, with_entry_settings
from .duplex_link import DuplexBinding, DuplexConversation, RoundEnds
from .kernel import Kernel
from .link_settings import LinkSettingsError, wyoming_settings
from .sessions import SessionManager
from .wyoming_link import LinkState, WyomingSatelliteLink
from .wyoming_proto import PeerInfo, WyomingConnection, WyomingProtocolError, peer_info

_LOGGER = logging.getLogger(__name__)

PROBE_TIMEOUT: Final = 10.0  # seconds for connect + describe → info
PROBE_MAX_EVENTS: Final = 16  # events a probed peer may send before its info
PROBES_PER_MINUTE: Final = 6  # discovery probes (ProbeGate)
PROBE_REMEMBER_S: Final = 600.0  # a discovery probe's result is kept this long
WAKE_WORD_SATELLITE: Final = "satellite"  # the satellite's own wake word service
DEFAULT_WAKE_WORD: Final = "okay_nabu"
WYOMING_DOMAIN: Final = "wyoming"  # Home Assistant's own wyoming integration
ISSUE_CONFLICT: Final = "wyoming_conflict"
# Dispatcher signal (format with entry id and satellite key): a link changed.
SIGNAL_WYOMING_UPDATE: Final = "rtvoice_wyoming_update_{}_{}"


class WyomingProbeError(Exception):
    """The satellite cannot be added; ``reason`` is the form's error key."""

    def __init__(self, reason: str) -> None:
        """Keep the reason (a translation key)."""
        super().__init__(reason)
        self.reason = reason


async def async_probe_wyoming(host: str, port: int) -> PeerInfo:
    """Connect, ``describe``, read the ``info``; it must show a satellite.

    Reasons: ``cannot_connect`` (nothing answers, or no info in time),
    ``not_wyoming_satellite`` (a Wyoming service without a satellite: STT, TTS,
    wake word servers; or a peer that breaks the protocol or its limits: an
    oversized or malformed event or ``info``). Bounded: ``PROBE_TIMEOUT`` overall,
    ``PROBE_MAX_EVENTS`` events before the ``info``, each event within the
    reader's limits (``wyoming_proto``).
    """
    connection = WyomingConnection(host, port)
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            await connection.connect()
            await connection.write_event(Describe().event())
            info = await _read_info(connection)
    except WyomingProtocolError as err:
        _LOGGER.debug("Probing %s:%s: not a satellite (%s)", host, port, err)
        raise WyomingProbeError("not_wyoming_satellite") from err
    except (OSError, TimeoutError) as err:
        _LOGGER.debug("Probing %s:%s failed: %s", host, port, type(err).__name__)
        raise WyomingProbeError("cannot_connect") from err
    finally:
        await connection.disconnect()
    if not info.is_satellite:
        raise WyomingProbeError("not_wyoming_satellite")
    return info


async def _read_info(connection: WyomingConnection) -> PeerInfo:
    for _ in range(PROBE_MAX_EVENTS):
        event = await connection.read_event()
        if event is None:
            raise ConnectionError("closed before its info")
        if Info.is_type(event.type):
            return peer_info(event)
    raise WyomingProtocolError("no info")


class ProbeGate:
    """Probes of discovered services: one at a time, a few a minute, results kept.

    A discovery probe runs with no user action, for every name an mDNS responder
    announces: a hostile one announces thousands. The gate runs one probe at a
    time, at most ``per_minute`` of them in any minute (beyond that the discovery
    ends with ``probe_rate_limited``, to be offered again by a later
    announcement), and keeps each result (the info or the reason) for
    ``remember_s`` under every key given (host:port and the zeroconf name), so a
    repeated announcement is answered without a probe (``cannot_connect`` is
    not kept: the satellite may be up by its next announcement). At most ``max_kept``
    results are kept (the oldest go first).
    """

    def __init__(
        self,
        *,
        per_minute: int = PROBES_PER_MINUTE,
        remember_s: float = PROBE_REMEMBER_S,
        max_kept: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Start with no probe run and nothing kept."""
        self._per_minute = per_minute
        self._remember_s = remember_s
        self._max_kept = max_kept
        self._clock = clock
        self._lock = asyncio.Lock()
        self._starts: deque[float] = deque()
        self._kept: OrderedDict[str, tuple[float, PeerInfo | str]] = OrderedDict()
        self.probes = 0  # probes run
        self.limited = 0  # discoveries refused by the rate limit

    def _recall(self, keys: Sequence[str]) -> PeerInfo | str | None:
        now = self._clock()
        for key in keys:
            kept = self._kept.get(key)
            if kept is None:
                continue
            if now - kept[0] > self._remember_s:
                del self._kept[key]
                continue
            return kept[1]
        return None

    def _keep(self, keys: Sequence[str], result: PeerInfo | str) -> None:
        now = self._clock()
        for key in keys:
            self._kept.pop(key, None)
            self._kept[key] = (now, result)
        while len(self._kept) > self._max_kept:
            self._kept.popitem(last=False)

    async def probe(
        self, keys: Sequence[str], run: Callable[[], Awaitable[PeerInfo]]
    ) -> PeerInfo:
        """Return ``run()``'s info (or raise its error), through the gate."""
        kept = self._recall(keys)
        if kept is None:
            now = self._clock()
            while self._starts and now - self._starts[0] >= 60.0:
                self._starts.popleft()
            if len(self._starts) >= self._per_minute:
                self.limited += 1
                raise WyomingProbeError("probe_rate_limited")
            self._starts.append(now)
            async with self._lock:
                kept = self._recall(keys)  # probed while this one waited
                if kept is None:
                    self.probes += 1
                    try:
                        kept = await run()
                    except WyomingProbeError as err:
                        if err.reason == "cannot_connect":
                            raise  # not kept: it may be up by the next announcement
                        kept = err.reason
                    self._keep(keys, kept)
        if isinstance(kept, str):
            raise WyomingProbeError(kept)
        return kept


DATA_PROBE_GATE: Final = "rtvoice_wyoming_probe_gate"


@callback
def async_probe_gate(hass: HomeAssistant) -> ProbeGate:
    """Return the gate of discovery probes (one per Home Assistant)."""
    gate: ProbeGate | None = hass.data.get(DATA_PROBE_GATE)
    if gate is None:
        gate = hass.data[DATA_PROBE_GATE] = ProbeGate()
    return gate


def wyoming_key(conf: Mapping[str, Any]) -> str:
    """Return the stable key of a stored Wyoming satellite (host:port)."""
    return f"{conf[CONF_HOST]}:{conf.get(CONF_PORT, DEFAULT_WYOMING_PORT)}"


def wyoming_unique_id(entry_id: str, key: str) -> str:
    """Return the satellite entity's unique id (its pipeline select's id prefix)."""
    return f"{entry_id}-wyoming-{key}"


def wyoming_device_info(key: str, conf: Mapping[str, Any]) -> dr.DeviceInfo:
    """Describe the satellite's own device (the satellite's name from its info)."""
    return dr.DeviceInfo(
        identifiers={(DOMAIN, f"wyoming-{key}")},
        name=str(conf.get(CONF_NAME) or conf[CONF_HOST]),
        manufacturer="Wyoming",
        model="Wyoming satellite",
    )


@callback
def wyoming_chosen_pipeline(hass: HomeAssistant, entry_id: str, key: str) -> str | None:
    """Pipeline id chosen in the satellite's pipeline select (None: preferred)."""
    return get_chosen_pipeline(hass, DOMAIN, wyoming_unique_id(entry_id, key))


def wake_word_of(conf: Mapping[str, Any]) -> str:
    """Return the satellite's wake word: a bundled model id or ``satellite``."""
    wake_word = str(conf.get(CONF_WAKE_WORD, DEFAULT_WAKE_WORD))
    return wake_word if wake_word in MODELS_BY_ID else WAKE_WORD_SATELLITE


def wake_model(conf: Mapping[str, Any]) -> str | None:
    """Return the bundled model waking this satellite on the server (None: its own)."""
    wake_word = conf.get(CONF_WAKE_WORD, DEFAULT_WAKE_WORD)
    return wake_word if wake_word in MODELS_BY_ID else None


class WyomingSatellites:
    """The Wyoming satellites of one entry: one ``WyomingSatelliteLink`` each."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry_id: str,
        kernel: Kernel,
        round_ends: RoundEnds,
        satellites: Sequence[Mapping[str, Any]],
        *,
        sessions: SessionManager,
    ) -> None:
        """Bind the stored satellites to the entry's kernel (nothing runs yet)."""
        self.hass = hass
        self.entry_id = entry_id
        self.kernel = kernel
        self.round_ends = round_ends
        self.sessions = sessions
        self.configs: dict[str, Mapping[str, Any]] = {
            wyoming_key(conf): conf for conf in satellites
        }
        self.bindings: dict[str, DuplexBinding] = {
            key: satellite_binding(
                hass,
                sessions,
                kernel,
                round_ends,
                name=str(conf.get(CONF_NAME) or key),
                conf=conf,
                choice=functools.partial(wyoming_chosen_pipeline, hass, entry_id, key),
            )
            for key, conf in self.configs.items()
        }
        self.entity_ids: dict[str, str] = {}  # satellite key → its entity id
        self.links: dict[str, WyomingSatelliteLink] = {}
        self.states: dict[str, SessionState | None] = {}
        self.engine: WakeWordEngine | None = None
        self.conflicts: set[str] = set()
        self._unlisten: Any = None

    async def async_start(self) -> None:
        """Warm the wake word models, start every link, watch for conflicts.

        A failure (or cancel) part-way closes what was started.
        """
        if not self.configs:
            return
        try:
            await self._async_warm_engine()
            for key, conf in self.configs.items():
                self._start_link(key, conf)
            self._unlisten = async_dispatcher_connect(
                self.hass, SIGNAL_CONFIG_ENTRY_CHANGED, self._entry_changed
            )
            self._check_conflicts()
        except BaseException:
            await self.async_stop()
            raise

    async def _async_warm_engine(self) -> None:
        models = sorted(
            {m for conf in self.configs.values() if (m := wake_model(conf))}
        )
        if not models:
            return
        engine = WakeWordEngine(models)
        try:
            await self.hass.async_add_executor_job(engine.warm_up)
        except WakeWordUnavailableError as err:
            _LOGGER.warning(
                "Wake words on the server are unavailable for Wyoming satellites"
                " (%s); only a wake word service on the satellite wakes them",
                err,
            )
            return
        self.engine = engine

    def _start_link(self, key: str, conf: Mapping[str, Any]) -> None:
        try:
            settings = wyoming_settings(conf)
        except LinkSettingsError as err:
            _LOGGER.error("Wyoming satellite %s: unusable settings (%s)", key, err)
            return
        model = wake_model(conf)
        link = WyomingSatelliteLink(
            settings.host,
            settings.port,
            self.bindings[key],
            name=str(conf.get(CONF_NAME) or key),
            wake=self.engine if model is not None else None,
            wake_model_ids=[model] if model is not None else None,
            on_state=functools.partial(self._link_state, key),
            on_session_state=functools.partial(self._session_state, key),
        )
        self.links[key] = link
        link.start()

    def configure(self) -> None:
        """Apply the entry's conversation settings (changed options, no reload).

        Conversations opened from now on use them; running ones keep theirs.
        """
        for key, binding in self.bindings.items():
            self._set_binding(key, with_entry_settings(binding, self.sessions.settings))

    def _set_binding(self, key: str, binding: DuplexBinding) -> None:
        self.bindings[key] = binding
        if (link := self.links.get(key)) is not None:
            link.binding = binding

    @callback
    def set_prompt_scope(self, key: str, scope: str | None) -> None:
        """Render the satellite's prompt sections (its entity id) in its conversations.

        Applies to conversations opened from now on; the entity id also names
        the satellite of its conversations in the control plane.
        """
        if scope is not None:
            self.entity_ids[key] = scope
        self._set_binding(
            key, dataclasses.replace(self.bindings[key], prompt_scope=scope)
        )

    async def async_stop(self) -> None:
        """Close every link (conversations handed off); no task is left."""
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        for key in list(self.conflicts):
            self._set_conflict(key, None)
        links = list(self.links.values())
        self.links.clear()
        await asyncio.gather(*(link.aclose() for link in links))

    @callback
    def async_store(self, key: str, **settings: Any) -> None:
        """Store changed settings of satellite ``key`` in its subentry.

        The entry reloads (the update listener), and the satellite's link with it.
        """
        entry = self.hass.config_entries.async_get_entry(self.entry_id)
        if entry is None:
            return
        for subentry in entry.subentries.values():
            if subentry.subentry_type == SUBENTRY_WYOMING and (
                wyoming_key(subentry.data) == key
            ):
                self.hass.config_entries.async_update_subentry(
                    entry, subentry, data={**subentry.data, **settings}
                )

    # --- HA's wyoming integration holding the same satellite ---------------------

    @callback
    def _entry_changed(self, change: ConfigEntryChange, entry: ConfigEntry) -> None:
        if entry.domain == WYOMING_DOMAIN:
            self._check_conflicts()

    @callback
    def _check_conflicts(self) -> None:
        holders: dict[str, ConfigEntry] = {}
        for entry in self.hass.config_entries.async_entries(
            WYOMING_DOMAIN, include_ignore=False
        ):
            if CONF_HOST in entry.data and CONF_PORT in entry.data:
                key = f"{str(entry.data[CONF_HOST]).lower()}:{entry.data[CONF_PORT]}"
                holders[key] = entry
        for key, conf in self.configs.items():
            other = holders.get(
                f"{str(conf[CONF_HOST]).lower()}:"
                f"{conf.get(CONF_PORT, DEFAULT_WYOMING_PORT)}"
            )
            self._set_conflict(key, other)

    @callback
    def _set_conflict(self, key: str, other: ConfigEntry | None) -> None:
        issue_id = f"{ISSUE_CONFLICT}_{self.entry_id}_{key}"
        if other is None:
            if key in self.conflicts:
                self.conflicts.discard(key)
                ir.async_delete_issue(self.hass, DOMAIN, issue_id)
            return
        self.conflicts.add(key)
        conf = self.configs[key]
        ir.async_create_issue(
            self.hass,
            DOMAIN,
            issue_id,
            is_fixable=False,
            is_persistent=False,
            severity=ir.IssueSeverity.WARNING,
            translation_key=ISSUE_CONFLICT,
            translation_placeholders={
                "name": str(conf.get(CONF_NAME) or key),
                "address": key,
                "other": other.title,
            },
        )

    # --- link changes → entities --------------------------------------------------

    @callback
    def _link_state(self, key: str, _state: LinkState) -> None:
        self._changed(key)

    @callback
    def _session_state(self, key: str, state: SessionState | None) -> None:
        self.states[key] = state
        link = self.links.get(key)
        if (
            state is not None
            and link is not None
            and link.conversation is not None
            and not link.conversation.closing
            and not self.sessions.is_duplex(link.conversation.child_id)
        ):
            entity_id = self.entity_ids.get(key)
            self.sessions.attach_duplex(  # once per conversation
                link.conversation.child_id,
                _WyomingHandle(link.conversation),
                satellite=entity_id,
                device_id=satellite_device_id(self.hass, entity_id),
            )
        self._changed(key)

    @callback
    def _changed(self, key: str) -> None:
        async_dispatcher_send(
            self.hass, SIGNAL_WYOMING_UPDATE.format(self.entry_id, key)
        )


class _WyomingHandle:
    """The sessions' handle of one Wyoming duplex conversation (``DuplexHandle``)."""

    def __init__(self, conversation: DuplexConversation) -> None:
        self._conversation = conversation

    @property
    def live(self) -> bool:
        """Whether a session listens (an answer is spoken on the satellite)."""
        return not self._conversation.ended

    async def aclose(self) -> None:
        """Close the conversation (hand-off); the link opens a new one on a wake word."""
        await self._conversation.aclose()

    def continue_next_start(self) -> bool:
        """Wyoming satellites do not start conversations."""
        return False
