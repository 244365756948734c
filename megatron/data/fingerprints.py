"""Data fingerprints: which token files a run reads, and whether they changed (A16, A17).

`dataset_fingerprints(train, valid, test)` maps the prefix of every `.bin`/`.idx` pair under the
datasets (blends are walked) to the fingerprint taken when the pair was opened
(`MMapIndexedDataset.fingerprint()`: sizes, mtimes, sha256 of the `.idx`, dtype and counts). A
checkpoint stores it (with `content_only=True`: no mtimes, so every rank holds the same); on
resume `compare_fingerprints(saved, current)` lists what differs in the files' content
(`CONTENT_KEYS`). Mtimes and locations are not compared, so data copied to another machine or
directory still matches: entries are paired by prefix, then by `.idx` hash, then by file name.
The `.bin` itself is compared by size only (hashing it means reading every token;
`MMapIndexedDataset.verify_checksum` does that on request).

`check_datasets_unchanged` re-reads the fingerprints during a run and compares all of them,
mtimes included (A16: files must not change while mapped).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from megatron.data.indexed_dataset import MMapIndexedDataset

CONTENT_KEYS = ("idx_sha256", "idx_bytes", "bin_bytes", "dtype", "num_documents", "num_tokens")


def indexed_datasets(*datasets: Any) -> list[MMapIndexedDataset]:
    """Every token file under `datasets`, one per prefix, sorted by prefix; None is skipped.

    Accepts `MMapIndexedDataset`s and anything with an `indexed_datasets()` method
    (`GPT2Dataset`, `BlendableDataset`).
    """
    found: dict[str, MMapIndexedDataset] = {}
    for dataset in datasets:
        if dataset is None:
            continue
        if isinstance(dataset, MMapIndexedDataset):
            found.setdefault(dataset.path, dataset)
        elif hasattr(dataset, "indexed_datasets"):
            for indexed in dataset.indexed_datasets():
                found.setdefault(indexed.path, indexed)
        else:
            raise TypeError(f"cannot find the token files of a {type(dataset).__name__}; expected "
                            "a GPT2Dataset, BlendableDataset or MMapIndexedDataset")
    return [found[k] for k in sorted(found)]


def dataset_fingerprints(*datasets: Any, content_only: bool = False) -> dict[str, dict]:
    """{prefix: fingerprint taken at open} for every token file under `datasets` (A17).

    `content_only` keeps "prefix" and `CONTENT_KEYS` (no mtimes): the same on every rank and
    machine holding the same data, which is what a checkpoint should store.
    """
    fingerprints = {d.path: dict(d.opened_fingerprint) for d in indexed_datasets(*datasets)}
    if content_only:
        keep = ("prefix",) + CONTENT_KEYS
        fingerprints = {p: {k: v for k, v in f.items() if k in keep}
                        for p, f in fingerprints.items()}
    return fingerprints


def check_datasets_unchanged(*datasets: Any) -> None:
    """Raise if any token file under `datasets` changed on disk since it was opened (A16)."""
    for dataset in indexed_datasets(*datasets):
        dataset.check_unchanged()


def compare_fingerprints(saved: Mapping[str, dict] | Iterable[dict],
                         current: Mapping[str, dict] | Iterable[dict]) -> list[str]:
    """Human-readable differences in content between two `dataset_fingerprints` results.

    An empty list means the same data. Either argument may also be a list of fingerprints
    (each with its "prefix").
    """
    saved, current = _by_prefix(saved, "saved"), _by_prefix(current, "current")
    pairs, only_saved, only_current = _pair(saved, current)
    problems = []
    for old_prefix, new_prefix in pairs:
        old, new = saved[old_prefix], current[new_prefix]
        where = old_prefix if old_prefix == new_prefix else f"{old_prefix} (now {new_prefix})"
        for key in CONTENT_KEYS:
            if old.get(key) != new.get(key):
                problems.append(f"{where}: {key} was {_show(old.get(key))} in the checkpoint, "
                                f"is {_show(new.get(key))} now")
    problems += [f"{p}: read by the checkpointed run, not by this one" for p in only_saved]
    problems += [f"{p}: read by this run, not by the checkpointed one" for p in only_current]
    return problems


def _by_prefix(fingerprints, which: str) -> dict[str, dict]:
    if isinstance(fingerprints, Mapping):
        return {str(k): dict(v) for k, v in fingerprints.items()}
    out = {}
    for fingerprint in fingerprints:
        if "prefix" not in fingerprint:
            raise ValueError(f"{which} fingerprint {fingerprint!r} has no 'prefix'")
        out[str(fingerprint["prefix"])] = dict(fingerprint)
    return out


def _pair(saved: dict[str, dict], current: dict[str, dict]):
    """([(saved prefix, current prefix)], unpaired saved, unpaired current).

    Same prefix first; then, among the rest, a unique equal `.idx` hash; then a unique equal
    file name (moved data whose content may have changed).
    """
    pairs = [(p, p) for p in sorted(saved) if p in current]
    rest_saved = [p for p in sorted(saved) if p not in current]
    rest_current = [p for p in sorted(current) if p not in saved]
    for key in (lambda fp, p: fp.get("idx_sha256"), lambda fp, p: os.path.basename(p)):
        old_keys = {p: key(saved[p], p) for p in rest_saved}
        new_keys = {p: key(current[p], p) for p in rest_current}
        for old, value in old_keys.items():
            new = [p for p, v in new_keys.items() if v == value]
            if value is not None and len(new) == 1 and list(old_keys.values()).count(value) == 1:
                pairs.append((old, new[0]))
                rest_saved.remove(old)
                rest_current.remove(new[0])
                del new_keys[new[0]]
    return pairs, rest_saved, rest_current


def _show(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, str) and len(value) == 64:  # a sha256: the start is enough to tell
        return value[:12] + "..."
    return str(value)
