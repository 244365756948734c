"""megatron/monitoring/progress.py: bars on rank 0 only, on a terminal unless NEOX_PROGRESS
forces them; what a user sees is checked on stderr (a real pseudo-terminal for the TTY case)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from megatron.monitoring.progress import progress, progress_enabled
from tests.runs import ROOT

SCRIPT = ("from megatron.monitoring.progress import progress\n"
          "for _ in progress(range(7), desc='working', unit='item'): pass\n")


def draw(env: dict, tty: bool) -> str:
    """stderr of a process that draws a 7-item bar; stderr a pseudo-terminal when `tty`."""
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "NEOX_PROGRESS")}
    full.update(env)
    if not tty:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=full,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, env=full,
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_gets_a_bar_and_a_pipe_none():
    assert "working: 100%" in draw({}, tty=True) and "7/7" in draw({}, tty=True)
    assert draw({}, tty=False) == ""


def test_neox_progress_forces_bars_on_or_off():
    assert "working: 100%" in draw({"NEOX_PROGRESS": "1"}, tty=False)
    assert draw({"NEOX_PROGRESS": "0"}, tty=True) == ""


def test_only_rank_0_draws():
    assert draw({"RANK": "1", "NEOX_PROGRESS": "1"}, tty=True) == ""
    assert "working: 100%" in draw({"RANK": "0", "NEOX_PROGRESS": "1"}, tty=False)


def test_a_disabled_bar_still_iterates_and_counts(monkeypatch):
    monkeypatch.setenv("NEOX_PROGRESS", "0")
    assert list(progress(range(3))) == [0, 1, 2]
    with progress(total=2) as bar:
        bar.update(2)


def test_an_unknown_value_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("NEOX_PROGRESS", "sometimes")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=r"^NEOX_PROGRESS='sometimes' is not understood: set it "
                                         r"to 1 to force progress bars on or 0 to turn them off"):
        progress_enabled()
