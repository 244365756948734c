"""The data position: the client state the loop saves (iteration, consumed samples, data
fingerprints), kept JSON-safe for the manifest and checked to be the same on every rank (A18)."""

from __future__ import annotations

import json


def client_state(iteration: int, state: dict) -> dict:
    """`state` plus the iteration, as plain JSON data (tuples become lists).

    TypeError names the key whose value JSON cannot hold.
    """
    merged = {**state, "iteration": int(iteration)}
    for key, value in merged.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as err:
            raise TypeError(f"checkpoint client state {key!r} = {value!r:.80} cannot be stored "
                            f"in the manifest ({err}); pass ints, floats, strings, lists and "
                            "dicts") from None
    return json.loads(json.dumps(merged))


def disagreement(states: list[dict]) -> str | None:
    """Which rank's client state differs from rank 0's, or None when all ranks agree."""
    for rank, state in enumerate(states):
        if state != states[0]:
            keys = sorted(k for k in set(state) | set(states[0])
                          if state.get(k) != states[0].get(k))
            detail = ", ".join(f"{k}: rank 0 {states[0].get(k)!r:.60} vs rank {rank} "
                               f"{state.get(k)!r:.60}" for k in keys)
            return f"ranks passed different client states to save_checkpoint ({detail})"
    return None


def resumed_state(saved: dict) -> dict:
    """What a resumed run continues from: a copy of the saved client state."""
    return json.loads(json.dumps(saved))
