"""Cluster mode: the machine-config-controller drives the agent through Node annotations."""
