"""Fixtures for the config tests: the repo root on sys.path, a recorder of the config package's
log lines, and a writer of temporary config files. Plain helpers live in neox_args_helpers.py."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def config_log():
    """Lines logged by megatron.neox_arguments during the test ("LEVEL message")."""
    logger = logging.getLogger("megatron.neox_arguments")
    handler, old_level = _ListHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> path of a file under tmp_path."""

    def _write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return _write
