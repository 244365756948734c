"""Data fingerprints: which token files a run reads, and whether their content changed (A16, A17).

`dataset_fingerprints(train, valid, test)` maps the prefix of every `.bin`/`.idx` pair under the
datasets (blends are walked) to its content fingerprint (`MMapIndexedDataset.fingerprint`: file
sizes, dtype, counts, sha256 of the whole `.idx` and of 64 sampled 64 KiB blocks of the `.bin`;
with mode "full" also the sha256 of the whole `.bin`). Modification times are no part of it, so
`touch` or a copy to another machine or directory changes nothing. A checkpoint stores it; on
resume `compare_fingerprints(saved, current)` lists what differs (entries are paired by prefix,
then by `.idx` hash, then by file name). A hash is compared when both sides recorded it: a
checkpoint written in sampled mode resumed in full mode compares the sampled hashes.

`check_datasets_unchanged` re-takes the sampled fingerprints during a run (before each save) and
compares them with those taken when the files were opened (A16). `check_file_sizes` compares
the sizes of the files being read with their indices: the cheap test that explains a failed read.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Mapping

from megatron.data.indexed_dataset import MMapIndexedDataset, TokenFileChanged
from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

FINGERPRINT_MODES = ("sampled", "full")
CONTENT_KEYS = ("idx_sha256", "idx_bytes", "bin_bytes", "bin_sampled_sha256", "bin_sha256",
                "dtype", "num_documents", "num_tokens")


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


def dataset_fingerprints(*datasets: Any, mode: str = "sampled") -> dict[str, dict]:
    """{prefix: content fingerprint} for every token file under `datasets` (A17).

    "sampled" gives the fingerprints taken when the files were opened; "full" adds the sha256 of
    every `.bin`, read now in full (minutes per terabyte).
    """
    if mode not in FINGERPRINT_MODES:
        raise ValueError(f"data_fingerprint {mode!r} is not a valid choice; choose one of: "
                         f"{', '.join(FINGERPRINT_MODES)}")
    fingerprints = {}
    for dataset in indexed_datasets(*datasets):
        fingerprints[dataset.path] = dict(dataset.opened_fingerprint)
        if mode == "full":
            start = time.perf_counter()
            fingerprints[dataset.path]["bin_sha256"] = dataset.verify_checksum()
            logger.info("data_fingerprint full: hashed %s.bin (%d bytes) in %.1f s",
                        dataset.path, fingerprints[dataset.path]["bin_bytes"],
                        time.perf_counter() - start)
    return fingerprints


def check_datasets_unchanged(*datasets: Any) -> None:
    """Raise `TokenFileChanged` if the content of any token file under `datasets` differs from
    when it was opened (A16), naming each file and what differs; mtimes are not compared."""
    problems = []
    for dataset in indexed_datasets(*datasets):
        try:
            now = dataset.fingerprint()
        except FileNotFoundError as err:
            problems.append(f"{err.filename} was removed")
            continue
        problems += _differences(dataset.path, dataset.opened_fingerprint, now,
                                 "when this run opened it")
    if problems:
        raise TokenFileChanged(
            f"token files changed on disk while training read them: {'; '.join(problems)}. "
            "Batches since the change may mix old and new data, so no checkpoint is saved. "
            "Restore the files and resume from the last checkpoint, or resume with "
            "allow_data_change: true to train on the new data")


def check_file_sizes(*datasets: Any) -> None:
    """Raise `TokenFileChanged` if a token file under `datasets` no longer has the size its index
    gives (A16): the explanation of a read that failed because a file shrank under the run."""
    for dataset in indexed_datasets(*datasets):
        dataset.check_sizes()


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
        where = old_prefix if old_prefix == new_prefix else f"{old_prefix} (now {new_prefix})"
        problems += _differences(where, saved[old_prefix], current[new_prefix],
                                 "in the checkpoint")
    problems += [f"{p}: read by the checkpointed run, not by this one" for p in only_saved]
    problems += [f"{p}: read by this run, not by the checkpointed one" for p in only_current]
    return problems


def changed_data_error(load: str, differences: list[str]) -> RuntimeError:
    """The refusal of a resume on data that differs from the checkpoint's (A17)."""
    return RuntimeError(f"the training data differs from the data checkpoint {load} was trained "
                        f"on: {'; '.join(differences)}. Restore those files, or set "
                        "allow_data_change: true to continue on the new data")


def _differences(where: str, old: Mapping, new: Mapping, then: str) -> list[str]:
    """"WHERE: KEY was A THEN, is B now" for every content key both sides recorded and that
    differs; sampled hashes count only when taken with the same blocks."""
    keys = [k for k in CONTENT_KEYS if old.get(k) is not None and new.get(k) is not None]
    if old.get("bin_sample") != new.get("bin_sample") and "bin_sampled_sha256" in keys:
        keys.remove("bin_sampled_sha256")
    return [f"{where}: {key} was {_show(old[key])} {then}, is {_show(new[key])} now"
            for key in keys if old[key] != new[key]]


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
    if isinstance(value, str) and len(value) == 64:  # a sha256: the start is enough to tell
        return value[:12] + "..."
    return str(value)
