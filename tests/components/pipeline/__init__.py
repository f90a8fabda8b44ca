"""Shared test rig of the session, conversation and pipeline tests."""
