"""The one exception type the config package raises for user mistakes.

Every message is a sentence a user can act on: it names the file (or "command line"), the key,
the value and the rule that failed. Callers print `str(error)`; no traceback is needed.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file, override or value that cannot be used, with what to change."""


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """A config file named on the command line does not exist."""
