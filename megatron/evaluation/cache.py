"""eval.py's score cache (eval_cache_dir): what finished requests scored or generated, kept in
an sqlite file so that an evaluation stopped part-way and run again does only the rest.

    cache = ScoreCache.open(directory, setup, replicas)   # setup: what the scores depend on
    found = cache.lookup("loglikelihood", request_args)     # a score or None each, every rank
    cache.store("loglikelihood", request_args, scores)      # the writer rank, then committed

One file per checkpoint and scoring setup: `setup` (megatron/evaluation/run.py score_cache: the
checkpoint's path, iteration and files, the model config, the tokenizer's files, dtype, device,
tensor-parallel size, replicas, batch size; and the round) names it, so a cache is never read
for another model or another way of batching. Only the writer rank
(global rank 0) reads and writes the file; it hands what it found to the other ranks, so every
rank scores the same requests. Each round of requests is committed before the next starts: a
stop loses at most the round in progress.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

ROUND_BATCHES = 32  # a round: this many batches of every replica, scored then committed


def request_key(kind: str, args) -> str:
    return hashlib.sha256(json.dumps([kind, list(args)], sort_keys=True, default=str)
                          .encode()).hexdigest()


class ScoreCache:
    """Scores (and generated texts) by request, in `path` (read and written by the writer
    rank only)."""

    def __init__(self, path: Path, writer: bool, round_size: int):
        self.path, self.writer, self.round_size = path, writer, round_size
        self.db = None
        if writer:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path))
            self.db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, "
                            "value TEXT NOT NULL)")
            self.db.commit()

    @classmethod
    def open(cls, directory: str, setup: dict, replicas,
             round_batches: int = ROUND_BATCHES) -> "ScoreCache":
        """The cache of this checkpoint and scoring setup in `directory`."""
        round_size = round_batches * setup["batch_size"] * replicas.count
        name = hashlib.sha256(json.dumps({**setup, "round": round_size}, sort_keys=True)
                              .encode()).hexdigest()[:16]
        cache = cls(Path(directory) / f"scores-{name}.sqlite", replicas.writer, round_size)
        if replicas.writer:
            log.info("eval cache: %s (%s)", cache.path, ", ".join(
                f"{k} {v}" for k, v in sorted(setup.items())
                if k not in ("files", "model", "tokenizer")))
        return cache

    def lookup(self, kind: str, args_list: list) -> list:
        """The stored score of each request or None, the writer's answer on every rank."""
        found = None
        if self.writer:
            found = []
            for args in args_list:
                row = self.db.execute("SELECT value FROM scores WHERE key = ?",
                                      (request_key(kind, args),)).fetchone()
                found.append(None if row is None else _decode(json.loads(row[0])))
            hits = sum(v is not None for v in found)
            log.info("eval cache: %d of %d %s requests already %s", hits, len(found), kind,
                     "generated" if kind == "generate_until" else "scored")
        return _from_writer(found)

    def store(self, kind: str, args_list: list, values: list) -> None:
        """Keep the scores of these requests (the writer rank), committed before returning."""
        if not self.writer:
            return
        self.db.executemany("INSERT OR REPLACE INTO scores VALUES (?, ?)",
                            [(request_key(kind, a), json.dumps(v))
                             for a, v in zip(args_list, values)])
        self.db.commit()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


def _decode(value):
    return tuple(value) if isinstance(value, list) else value


def _from_writer(obj):
    """`obj` of global rank 0 on every rank."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
