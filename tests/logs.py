"""A log handler that keeps the warnings a test provokes, for asserting what a user reads."""

import logging


class Warnings(logging.Handler):
    """Collects the message of every WARNING (or worse) record it receives."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())
