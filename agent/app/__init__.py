"""The top: the command line and the wiring of a source, a host and the engine into a running
agent."""
