"""Tests of the realtime kernel (no Home Assistant needed)."""
