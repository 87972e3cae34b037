"""Host ports: the only way the engine touches a host (real, simulated, or none for dry runs)."""
