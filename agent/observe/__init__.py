"""Logs, metrics and HTTP endpoints."""
