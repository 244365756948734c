"""Cutting a token sequence into model-sized windows so every scored token is predicted once (A26).

A request is tokens t_0 .. t_{N-1} whose last `num_scored` tokens are scored (each predicted
from the tokens before it); t_0 is never scored (it is the context or the EOD prefix). The
scored tokens are taken in chunks of at most `max_len` from the left; each chunk's window is the
`max_len` tokens (or as many as there are) that end just before the chunk's last target, so the
last chunk still gets a full window of context:

    tokens  E 0 1 2 3 4 5 6 7 8 9     max_len 4, all ten text tokens scored (E = EOD prefix)
    window  E 0 1 2 -> predicts 0 1 2 3   (all scored)
    window  3 4 5 6 -> predicts 4 5 6 7   (all scored)
    window  5 6 7 8 -> predicts 6 7 8 9   (last 2 scored)

This is lm-eval's rolling-window scheme; for a request shorter than the window it is one pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """One forward pass: `inputs` [n] predict `targets` [n]; the last `num_scored` count."""

    request: int
    inputs: tuple[int, ...]
    targets: tuple[int, ...]
    num_scored: int


def scoring_windows(tokens: list[int], num_scored: int, max_len: int, request: int = 0
                    ) -> list[Window]:
    """Windows of at most max_len inputs covering the last num_scored tokens exactly once."""
    n = len(tokens)
    if max_len < 1:
        raise ValueError(f"window length {max_len} must be at least 1")
    if not 0 <= num_scored < max(n, 1):
        raise ValueError(f"cannot score {num_scored} of {n} tokens: the first token is only "
                         "context (prefix EOD when there is no context)")
    out = []
    for first in range(n - num_scored, n, max_len):
        end = min(first + max_len, n)  # targets first .. end-1
        start = max(0, end - 1 - max_len)
        out.append(Window(request, tuple(tokens[start:end - 1]), tuple(tokens[start + 1:end]),
                          end - first))
    return out
