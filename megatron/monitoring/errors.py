"""How an exception reads to a user: one line, with gloo's long lost-peer message shortened."""

from __future__ import annotations

import re

# gloo, when the peer at the other end of a connection is gone: "[.../gloo/transport/tcp/
# pair.cc:537] Read error [10.0.0.2]:59078: Connection reset by peer. This is typically caused
# by a remote worker hanging ..."
GLOO_PEER_ERROR = re.compile(r"gloo/transport/tcp/pair\.cc:\d+\] (?P<what>.*?(?:reset by peer|"
                             r"[Cc]onnection closed by peer|Broken pipe))")


def lost_peer(err: BaseException) -> bool:
    """Whether `err` is gloo saying the rank at the other end of a connection is gone."""
    return GLOO_PEER_ERROR.search(str(err)) is not None


def describe_error(err: BaseException) -> str:
    """The one-line message of a user-facing error; a lost connection to another rank (gloo's
    long message) says so and where to look."""
    text = str(err)
    m = GLOO_PEER_ERROR.search(text)
    if m:
        return (f"lost the connection to another rank ({m['what']}): that rank stopped or "
                "died; its own lines above say why")
    return text
