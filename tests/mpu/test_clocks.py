"""A5 on real gloo processes: one rank's wall clock is set two minutes ahead (the failure
injected: its time.time() is shifted); rank 0 measures the skew at start-up and names the rank,
its host and the offset. Clocks that agree say nothing."""

from __future__ import annotations

import socket
import time

import pytest

from megatron.mpu.clocks import clock_offsets, skew_message
from tests.distributed import run_distributed


def _offsets(rank, world, ahead):
    if rank == 1 and ahead:
        real = time.time
        time.time = lambda: real() + ahead
    return clock_offsets()


def test_a_clock_two_minutes_ahead_is_named():
    offsets = run_distributed(_offsets, 2, 120.0)[0]
    assert offsets[0][1] == 0 and offsets[1][1] == pytest.approx(120.0, abs=2.0)
    message = skew_message(offsets)
    host = socket.gethostname()
    assert message.startswith(f"the wall clocks of rank 1 (on {host}) differ from rank 0's "
                              f"({host}) by up to +1")
    assert "synchronise the nodes' clocks (NTP / chrony)" in message


def test_agreeing_clocks_say_nothing():
    offsets = run_distributed(_offsets, 2, 0.0)[0]
    assert abs(offsets[1][1]) < 2.0 and skew_message(offsets) is None
