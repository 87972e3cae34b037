"""The update engine: the one place that orders side effects on a host, each journaled before
it happens, and the durable records it keeps (phase journal, current and pending configs)."""
