"""Host ports: the only way the engine touches a host (this machine, another implementation
of the ports, or none for dry runs)."""
