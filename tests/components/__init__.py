"""Tests of the Home Assistant facing parts of Realtime Voice (with the HA harness)."""
