"""Logging, metrics trackers and timers."""
