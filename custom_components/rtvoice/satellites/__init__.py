"""Satellites: the ones Home Assistant knows, and the ones an entry owns."""
