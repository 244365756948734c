"""The manifest: one JSON file per checkpoint saying what it holds and how to check it.

    {
      "format": "gpt-neox-checkpoint",
      "format_version": 1,
      "iteration": 20,
      "tag": "global_step20",
      "run": {"tp": 1, "pp": 1, "pipe_parallel_size": 1, "dp": 2, "world_size": 2,
              "zero_stage": 0, "precision": "fp32", "num_layers": 4, "hidden_size": 128,
              "num_attention_heads": 4, "num_kv_heads": 4, "padded_vocab_size": 2048},
      "contents": {"optimizer": true, "rng": true},
      "client_state": {"iteration": 20, "consumed_train_samples": 320, ...},
      "config": {...every resolved config key...},
      "versions": {"torch": "2.13.0", "deepspeed": "0.19.8"},
      "files": {"mp_rank_00_model_states.pt": {"size": 1234, "sha256": "ab12...", "rank": 0},
                "rng/rank_1.pt": {...}, "config.yml": {...}, ...}
    }

Paths under "files" are relative to the checkpoint directory, with "/"; "rank" is the global rank
that wrote the file. The manifest does not list itself. It is written after every listed file
was fsynced, so a directory whose manifest reads and whose files all match it is complete.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from megatron.checkpointing.durable import FileRecord, file_problem, write_bytes
from megatron.checkpointing.errors import CorruptFileError
from megatron.checkpointing.layout import MANIFEST_NAME

FORMAT = "gpt-neox-checkpoint"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its size, sha256 and the global rank that wrote it."""

    size: int
    sha256: str
    rank: int

    @property
    def record(self) -> FileRecord:
        return FileRecord(self.size, self.sha256)


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest.json of one checkpoint."""

    iteration: int
    tag: str
    run: dict
    contents: dict
    client_state: dict
    config: dict
    files: dict[str, FileEntry]
    versions: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        data = {"format": FORMAT, "format_version": self.format_version,
                "iteration": self.iteration, "tag": self.tag, "run": self.run,
                "contents": self.contents, "client_state": self.client_state,
                "config": self.config, "versions": self.versions,
                "files": {name: {"size": f.size, "sha256": f.sha256, "rank": f.rank}
                          for name, f in sorted(self.files.items())}}
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> "Manifest":
        """Parse and check the structure; CorruptFileError naming `source` and the bad field."""
        try:
            data = json.loads(text)
        except ValueError as err:
            raise CorruptFileError(f"{source}: not valid JSON ({err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CorruptFileError(f"{source}: not a {FORMAT} manifest (no \"format\": "
                                   f"\"{FORMAT}\")")
        expected = {"format_version": int, "iteration": int, "tag": str, "run": dict,
                    "contents": dict, "client_state": dict, "config": dict, "files": dict}
        for key, kind in expected.items():
            if not isinstance(data.get(key), kind):
                raise CorruptFileError(f"{source}: field {key!r} is missing or not a "
                                       f"{kind.__name__} (got {data.get(key)!r:.80})")
        files = {}
        for name, entry in data["files"].items():
            try:
                files[name] = FileEntry(int(entry["size"]), str(entry["sha256"]),
                                        int(entry["rank"]))
            except (KeyError, TypeError, ValueError):
                raise CorruptFileError(f"{source}: entry for file {name!r} lacks size/sha256/rank "
                                       f"(got {entry!r:.80})") from None
        return cls(iteration=data["iteration"], tag=data["tag"], run=data["run"],
                   contents=data["contents"], client_state=data["client_state"],
                   config=data["config"], files=files, versions=data.get("versions", {}),
                   format_version=data["format_version"])


def write_manifest(checkpoint_dir: Path, manifest: Manifest) -> FileRecord:
    """Write `checkpoint_dir/manifest.json` durably."""
    return write_bytes(manifest.to_json().encode("utf-8"), checkpoint_dir / MANIFEST_NAME)


def read_manifest(checkpoint_dir: Path) -> Manifest:
    """The manifest of `checkpoint_dir`; CorruptFileError when it is missing or malformed."""
    path = checkpoint_dir / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CorruptFileError(f"{path}: missing; the save that wrote {checkpoint_dir.name} did "
                               "not complete, or another tool wrote the directory") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CorruptFileError(f"{path}: cannot be read ({err})") from None
    return Manifest.from_json(text, str(path))


def assign_files(files: dict[str, FileEntry], world_size: int) -> list[list[str]]:
    """Split the files to hash among ranks: biggest first, each to the least loaded rank.

    Pure and deterministic, so every rank computes the same split from the same manifest.
    """
    shares: list[list[str]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for name in sorted(files, key=lambda n: (-files[n].size, n)):
        target = loads.index(min(loads))
        shares[target].append(name)
        loads[target] += files[name].size
    return shares


def check_files(checkpoint_dir: Path, manifest: Manifest, hash_names=(),
                threads: int = 2) -> list[str]:
    """Problems with the files: every file's presence and size, and the content of `hash_names`
    (hashed `threads` at a time). An empty list means they match the manifest."""
    hash_names = set(hash_names)
    problems = [p for name, entry in sorted(manifest.files.items()) if name not in hash_names
                for p in [file_problem(checkpoint_dir / name, entry.record, check_hash=False)] if p]
    names = sorted(hash_names & set(manifest.files))
    unknown = sorted(hash_names - set(manifest.files))
    if unknown:
        raise KeyError(f"not in the manifest: {unknown}")
    with ThreadPoolExecutor(max(1, min(threads, len(names) or 1))) as pool:
        found = pool.map(lambda n: file_problem(checkpoint_dir / n, manifest.files[n].record),
                         names)
        problems += [p for p in found if p]
    return problems
