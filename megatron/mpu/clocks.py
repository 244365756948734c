"""A5: the ranks' wall clocks agree closely enough for the timestamps this framework writes.

No decision here depends on clocks agreeing: durations are measured with a monotonic timer in
one process, the watchdog compares heartbeat counters, data fingerprints leave out modification
times. Timestamps are still written for people to read: the `time` of each metrics.jsonl record
(rank 0), the start time of the save-directory lock, log lines of every rank. When nodes' clocks
drift apart, lining up one node's log with another's misleads, so the skew is measured once at
start-up, right after the group's first barrier, and a skew over SKEW_WARN_SECONDS is reported.
"""

from __future__ import annotations

import socket
import time

from megatron.monitoring.logger import get_logger, who

log = get_logger(__name__)

SKEW_WARN_SECONDS = 5.0  # far above what leaving one barrier takes, far below NTP failures


def clock_offsets() -> list[tuple[str, float]]:
    """(host, this rank's wall clock minus rank 0's in seconds) for every rank. Collective."""
    import torch.distributed as dist

    dist.barrier()
    reading = (socket.gethostname(), time.time())
    readings: list = [None] * dist.get_world_size()
    dist.all_gather_object(readings, reading)
    zero = readings[0][1]
    return [(host, stamp - zero) for host, stamp in readings]


def skew_message(offsets: list[tuple[str, float]], limit: float = SKEW_WARN_SECONDS) -> str | None:
    """The warning for clocks more than `limit` seconds from rank 0's, or None."""
    off = [rank for rank, (_, delta) in enumerate(offsets) if abs(delta) > limit]
    if not off:
        return None
    worst = max(off, key=lambda r: abs(offsets[r][1]))
    hosts = sorted({offsets[r][0] for r in off})
    return (f"the wall clocks of {who(off)} (on {', '.join(hosts)}) differ from rank 0's "
            f"({offsets[0][0]}) by up to {offsets[worst][1]:+.1f} s (A5): timestamps in logs, "
            "metrics.jsonl and the save-directory lock do not line up across nodes. Training is "
            "not affected (durations and the watchdog use no wall clock); synchronise the "
            "nodes' clocks (NTP / chrony) to read logs side by side")


def check_clocks() -> None:
    """Measure the ranks' clock offsets and warn once, on rank 0, when they exceed the limit."""
    import torch.distributed as dist

    message = skew_message(clock_offsets())
    if message and dist.get_rank() == 0:
        log.warning("%s", message)
