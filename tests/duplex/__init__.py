"""Tests of the duplex core (no Home Assistant needed)."""
