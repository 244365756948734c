"""The one exception type the config package raises for user mistakes, and `BadValue`.

Every message is a sentence a user can act on: it names the file (or the command-line override),
the key, the value and the rule that failed. Callers print `str(error)`; no traceback is needed.
A rule about one key's value yields a `BadValue`, and `validate` puts where that value was set
in front of its message: `configs/a.yml: optimizer.params.lr('fast') must be ...`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator


class ConfigError(ValueError):
    """A config file, override or value that cannot be used, with what to change."""


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """A config file named on the command line does not exist."""


@dataclass(frozen=True)
class BadValue:
    """A rule's message about the value at one key path (`optimizer.params.lr`, `norm`)."""

    path: str
    message: str


Problems = Iterator[str | BadValue]  # what a validation rule yields
