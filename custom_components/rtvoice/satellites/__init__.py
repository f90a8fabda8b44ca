"""Satellites: the ones Home Assistant knows, and the ones an entry owns.

- ``directory``: every ``assist_satellite`` entity in Home Assistant (ESPHome,
  Wyoming, VoIP, ours …) with its prompt sections (pipeline mode and duplex mode);
- ``stored``: the duplex satellites an entry owns, one config subentry each
  (ESPHome, Wyoming), and the move of older entries' satellites into subentries;
- ``form``: the settings every owned satellite has (barge-in, echo cancellation,
  end silence, end of turn; the wake word of a Wyoming satellite);
- ``esphome`` / ``wyoming``: the subentry flow of each kind (add, take over,
  reconfigure); ``discovery``: the zeroconf steps of the config flow, which add a
  discovered satellite as a subentry of an existing entry.

The links that talk to the satellites (``esphome_link``, ``wyoming_link``) and their
Home Assistant glue (``duplex_ha``, ``wyoming_ha``, ``duplex_owner``) are still top
level modules.
"""
