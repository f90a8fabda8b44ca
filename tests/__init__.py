"""Tests of the Realtime Voice integration."""
