"""Real protocol peers (loopback servers) for tests."""
