"""How an exception reads to a user: one line, with gloo's long lost-peer and timeout messages
shortened."""

from __future__ import annotations

import re

# gloo, when the peer at the other end of a connection is gone: "[.../gloo/transport/tcp/
# pair.cc:537] Read error [10.0.0.2]:59078: Connection reset by peer. This is typically caused
# by a remote worker hanging ..."
GLOO_PEER_ERROR = re.compile(r"gloo/transport/tcp/pair\.cc:\d+\] (?P<what>.*?(?:reset by peer|"
                             r"[Cc]onnection closed by peer|Broken pipe))")


# a collective that waited past the process group's timeout: gloo's "[.../unbound_buffer.cc:81]
# Timed out waiting 120000ms for recv operation to complete", NCCL's "Watchdog caught
# collective operation timeout: WorkNCCL(..., Timeout(ms)=600000) ran for 600012 milliseconds"
COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for \w+ operation|"
                                r"collective operation timeout: .*?Timeout\(ms\)=(?P<nccl_ms>\d+)")


def collective_timeout(err: BaseException) -> float | None:
    """The seconds a timed-out collective waited, when `err` says one did; else None."""
    m = COLLECTIVE_TIMEOUT.search(str(err))
    return None if m is None else int(m["ms"] or m["nccl_ms"]) / 1000


def lost_peer(err: BaseException) -> bool:
    """Whether `err` is gloo saying the rank at the other end of a connection is gone."""
    return GLOO_PEER_ERROR.search(str(err)) is not None


def describe_error(err: BaseException) -> str:
    """The one-line message of a user-facing error; a lost connection to another rank (gloo's
    long message) says so and where to look."""
    text = str(err)
    waited = collective_timeout(err)
    if waited is not None:
        return (f"a collective timed out: this rank waited {waited:g} s "
                "(distributed_timeout_minutes) for another rank that never joined it; the "
                "'collective timeout:' lines above say where each rank was (they need log_dir "
                "and the hang watchdog). If a rank can legitimately take that long (a slow save "
                "or data load), raise distributed_timeout_minutes")
    m = GLOO_PEER_ERROR.search(text)
    if m:
        return (f"lost the connection to another rank ({m['what']}): that rank stopped or "
                "died; its own lines above say why")
    return text
