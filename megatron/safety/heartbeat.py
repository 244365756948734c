"""Heartbeat files: where each rank is, readable by every other rank without that rank's help.

Each rank's watchdog rewrites `<log_dir>/heartbeats/rank<R>.json` every few seconds from its own
thread, whatever the training thread is doing:

    {"rank": 1, "host": "node3", "pid": 4242, "iteration": 17, "phase": "train step",
     "seconds": 4.1, "where": "torch.distributed.all_reduce, called at ...", "beat": 312}

`seconds` is the time spent in `phase` so far and `beat` counts the writes. A rank that is
stopped (SIGSTOP), killed, or hung holding the interpreter lock writes no more, so its `beat`
stops changing; a rank blocked in a collective that waits for it keeps writing. `PeerReport`
compares two readings of every rank's file, a few intervals apart, and names the ranks whose
beat did not move. Comparing counters rather than timestamps needs no agreement between the nodes' clocks
(A5), and every duration in a file was measured by the rank that wrote it.

Files rather than the process group's TCP store: the store is served from rank 0's process, so
it falls silent exactly when rank 0 is the one stopped, while a stopped rank's file stays
readable. Naming ranks on other nodes needs a log_dir that every node shares.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from megatron.monitoring.logger import who

FINISHED = "run ended"  # the phase a rank writes last, when its run ends (done or failed)


def beat_path(directory: Path, rank: int) -> Path:
    return directory / f"rank{rank:05d}.json"


def write_beat(directory: Path, record: dict) -> None:
    """Replace this rank's file atomically, so a reader never sees half a record."""
    path = beat_path(directory, record["rank"])
    tmp = path.with_name(f"{path.name}.{record['pid']}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_beats(directory: Path, world_size: int) -> dict[int, dict]:
    """Every rank's last record that can be read; a missing or unreadable file is left out."""
    found = {}
    for rank in range(world_size):
        try:
            found[rank] = json.loads(beat_path(directory, rank).read_text())
        except (OSError, ValueError):
            continue
    return found


def describe(record: dict) -> str:
    """'iteration 17, train step' (or just the phase where the iteration is unknown)."""
    it = record.get("iteration")
    return f"iteration {it}, {record['phase']}" if it is not None else record["phase"]


@dataclass
class PeerReport:
    """Which ranks are not progressing, which have no heartbeat, and where the others are."""

    stalled: list[dict]
    missing: list[int]
    finished: list[int]
    progressing: list[dict]

    @classmethod
    def compare(cls, first: dict[int, dict], second: dict[int, dict], world_size: int,
                own_rank: int) -> "PeerReport":
        """From two `read_beats` some intervals apart; `own_rank` is known to be alive."""
        report = cls([], [], [], [])
        for rank in range(world_size):
            now = second.get(rank)
            if now is None:
                report.missing.append(rank)
            elif now["phase"] == FINISHED:
                report.finished.append(rank)
            elif rank != own_rank and rank in first and first[rank]["beat"] == now["beat"]:
                report.stalled.append(now)
            else:
                report.progressing.append(now)
        return report

    def lines(self, directory: Path, limit: int = 16) -> list[str]:
        out = []
        for r in self.stalled[:limit]:
            out.append(f"rank {r['rank']} (host {r['host']}, pid {r['pid']}) is not progressing: "
                       f"its heartbeat stopped at {describe(r)} after {r['seconds']:.1f} s, "
                       f"{r['where']} (the process is stopped, killed, or hung outside Python)")
        if len(self.stalled) > limit:
            out.append(f"not progressing either: {who([r['rank'] for r in self.stalled[limit:]])}")
        if self.missing:
            out.append(f"no heartbeat in {directory} from {who(self.missing)} (not started, or "
                       "on a node that does not share log_dir)")
        if self.finished:
            out.append(f"run ended (finished or failed): {who(self.finished)}")
        out.extend(self._groups())
        return out

    def _groups(self) -> list[str]:
        """The progressing ranks, grouped by where they are."""
        groups: dict[tuple, list[dict]] = {}
        for r in self.progressing:
            groups.setdefault((r.get("iteration"), r["phase"], r["where"]), []).append(r)
        return [f"alive: {who([r['rank'] for r in members])} at {describe(members[0])} "
                f"(for up to {max(r['seconds'] for r in members):.1f} s), {where}"
                for (_, _, where), members in groups.items()]


def last_beats(directory: Path, world_size: int, own_rank: int, own_host: str,
               limit: int = 16) -> list[str]:
    """Where the other ranks' last heartbeats put them, from one reading (what a rank whose
    collective timed out can say at once): ranks grouped by iteration, phase and place, with how
    long ago the files were written where the ranks run on this host (another node's file times
    come from its clock, A5; a network filesystem's from its server's, which may be off by that
    server's skew)."""
    beats = read_beats(directory, world_size)
    missing = [r for r in range(world_size) if r != own_rank and r not in beats]
    finished = [r for r, b in beats.items() if r != own_rank and b["phase"] == FINISHED]
    groups: dict[tuple, list[dict]] = {}
    for rank, record in sorted(beats.items()):
        if rank != own_rank and record["phase"] != FINISHED:
            groups.setdefault((record.get("iteration"), record["phase"], record["where"]),
                              []).append(record)
    out = []
    for (_, _, where), members in list(groups.items())[:limit]:
        ages = [_age(directory, r["rank"]) for r in members if r.get("host") == own_host]
        written = (f"; written {max(ages):.1f} s ago" if ages and len(ages) == len(members)
                   and None not in ages else "")
        longest = max(r["seconds"] for r in members)
        out.append(f"{who([r['rank'] for r in members])}: {describe(members[0])} for "
                   f"{'up to ' if len(members) > 1 else ''}{longest:.1f} s, {where}{written}")
    if len(groups) > limit:
        rest = [r["rank"] for members in list(groups.values())[limit:] for r in members]
        out.append(f"elsewhere: {who(rest)}")
    if missing:
        out.append(f"no heartbeat in {directory} from {who(missing)} (not started, or on a node "
                   "that does not share log_dir)")
    if finished:
        out.append(f"run ended (finished or failed): {who(finished)}")
    return out


def _age(directory: Path, rank: int) -> float | None:
    try:
        return max(0.0, time.time() - beat_path(directory, rank).stat().st_mtime)
    except OSError:
        return None
