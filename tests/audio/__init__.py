"""Tests of the HA-free audio logic (no Home Assistant needed)."""
