"""Test help only: the pytest plugin, the harness, the fake Messages API, the replay audit; no product code imports it."""
