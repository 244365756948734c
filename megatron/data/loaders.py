"""From data paths to train/valid/test datasets, and from a dataset to a resumable DataLoader.

Two ways to name data, as in GPT-NeoX:
- `data_path`: one prefix (or a list of prefixes) cut into train/valid/test by `split`; with
  several prefixes each split blends its parts in proportion to their tokens (or by document
  count with `weight_by_num_documents`).
- `train_data_paths` / `valid_data_paths` / `test_data_paths` with one weight per path
  (default: equal weights), or weights from document counts with `weight_by_num_documents`.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from megatron.data.blendable_dataset import BlendableDataset, normalize_weights
from megatron.data.fingerprints import (check_datasets_unchanged,  # noqa: F401 (re-exported)
                                        compare_fingerprints, dataset_fingerprints)
from megatron.data.aligned import check_pair, open_labels, read_rewards
from megatron.data.document_dataset import DocumentDataset, PairwiseDataset
from megatron.data.gpt2_dataset import GPT2Dataset
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.options import SampleOptions
from megatron.data.samplers import PretrainingSampler
from megatron.data.split_parts import Part, check_split_size, parts_per_split
from megatron.data.splits import SPLIT_NAMES, weights_by_num_documents
from megatron.data.token_ids import check_token_ids
from megatron.host import available_cpus  # noqa: F401 (re-exported)
from megatron.monitoring.logger import get_logger

logger = get_logger(__name__)

# Each part of train/valid/test_data_paths (even one alone) and each blended part of a data_path
# list is built with 0.5% spare samples, as GPT-NeoX builds those of its *_data_paths; one
# data_path prefix holds exactly the samples asked (GPT-NeoX's data_path).
_BLEND_MARGIN = 1.005


def build_train_valid_test_datasets(
    *, data_path: str | Sequence[str] | None = None,
    train_data_paths: Sequence[str] | None = None,
    valid_data_paths: Sequence[str] | None = None,
    test_data_paths: Sequence[str] | None = None,
    train_data_weights: Sequence[float] | None = None,
    valid_data_weights: Sequence[float] | None = None,
    test_data_weights: Sequence[float] | None = None,
    weight_by_num_documents: bool = False, weighted_sampler_alpha: float = 1.0,
    split: str = "969, 30, 1", seq_length: int, seed: int,
    train_valid_test_num_samples: Sequence[int], cache_dir: str | None = None,
    skip_warmup: bool = True, vocab_size: int | None = None, group: Any = None,
    global_batch_size: int | None = None, options: SampleOptions = SampleOptions(),
) -> tuple[Any, Any, Any]:
    """(train, valid, test) datasets; None for a split asked for 0 samples or given no data.

    With `vocab_size`, every token file is checked to hold only ids below it (A12; the largest
    id of each is kept in `cache_dir`, megatron.data.token_ids). With
    `global_batch_size`, a split asked for samples whose data gives fewer samples than one global
    batch is an error (A9). Under torch.distributed every rank of `group` (default: all ranks)
    must call this: rank 0 of the group builds the index caches while the others wait (see
    `GPT2Dataset`). `dataset_fingerprints(*result)` identifies every token file read (A17).
    """
    num_samples = [int(n) for n in train_valid_test_num_samples]
    if len(num_samples) != 3 or any(n < 0 for n in num_samples):
        raise ValueError(f"train_valid_test_num_samples must be three counts >= 0, got "
                         f"{list(train_valid_test_num_samples)}")
    if global_batch_size is not None and (int(global_batch_size) != global_batch_size
                                          or global_batch_size < 1):
        raise ValueError(f"global_batch_size must be an integer >= 1, got {global_batch_size}")
    opened: dict[str, MMapIndexedDataset] = {}

    def open_prefix(prefix: str) -> MMapIndexedDataset:
        if prefix not in opened:
            opened[prefix] = MMapIndexedDataset(prefix, skip_warmup=skip_warmup)
            if vocab_size is not None:
                check_token_ids(opened[prefix], vocab_size, cache_dir)
        return opened[prefix]

    per_split = parts_per_split(
        data_path, [train_data_paths, valid_data_paths, test_data_paths],
        [train_data_weights, valid_data_weights, test_data_weights],
        split, weight_by_num_documents, open_prefix, options.side_files)
    common = dict(seq_length=seq_length, seed=seed, cache_dir=cache_dir, group=group,
                  weight_by_num_documents=weight_by_num_documents,
                  alpha=weighted_sampler_alpha, open_prefix=open_prefix,
                  global_batch_size=None if global_batch_size is None else int(global_batch_size),
                  options=options, listed=not data_path)
    result = []
    for name, n, (parts, weights) in zip(SPLIT_NAMES, num_samples, per_split):
        if n == 0 or not parts:
            if n > 0:
                logger.warning("%s split has no documents; %d requested %s samples are ignored",
                               name, n, name)
            result.append(None)
            continue
        result.append(_build_split(name, parts, weights, n, **common))
    return tuple(result)


def _build_split(name, parts, weights, num_samples, *, seq_length, seed, cache_dir, group,
                 weight_by_num_documents, alpha, open_prefix, global_batch_size, options, listed):
    """One GPT2Dataset, or a BlendableDataset over several; `listed`: the parts are those of
    train/valid/test_data_paths, each asked for its share plus the margin even when alone."""
    names = [p.name for p in parts]
    if weight_by_num_documents:
        weights = weights_by_num_documents([len(p.documents) for p in parts], alpha)
    weights = normalize_weights(weights, len(parts), names)
    unused = [p.name for p, w in zip(parts, weights) if w == 0]
    if unused:
        logger.info("%s: %s have weight 0 and are not read", name, ", ".join(unused))
        parts, weights = zip(*[(p, w) for p, w in zip(parts, weights) if w > 0])
        names = [p.name for p in parts]
    if options.pack_impl == "packed":
        check_split_size(name, parts, open_prefix, seq_length, num_samples, global_batch_size)

    def build(part, n):
        return _part_dataset(part, n, seq_length=seq_length, seed=seed, cache_dir=cache_dir,
                             group=group, open_prefix=open_prefix, options=options)

    if len(parts) == 1:  # GPT-NeoX blends one listed path too: the same samples, in order
        return build(parts[0], math.ceil(num_samples * _BLEND_MARGIN) if listed else num_samples)
    datasets = [build(part, max(1, math.ceil(num_samples * w * _BLEND_MARGIN)))
                for part, w in zip(parts, weights)]
    return BlendableDataset(datasets, weights, num_samples=num_samples, names=names)


def _part_dataset(part: Part, num_samples: int, *, seq_length, seed, cache_dir, group,
                  open_prefix, options: SampleOptions):
    """The dataset of one part: packed token stream (GPT2Dataset), whole documents
    (DocumentDataset) or chosen/rejected pairs (PairwiseDataset), with the files beside it."""
    tokens = open_prefix(part.prefix)
    side = {kind: path for kind, path in part.files.items()}
    if options.dataset_impl == "pairwise":
        neg = open_prefix(side["neg"])
        check_pair(tokens, neg)
        labels = [open_labels(side[k], t) if k in side else None
                  for k, t in (("label", tokens), ("neg_label", neg))]
        return PairwiseDataset(part.name, part.prefix, part.documents, tokens, neg, num_samples,
                               seq_length, seed, options.pack_impl, options.allow_chopped,
                               labels[0], labels[1], pad_id=options.pad_id)
    labels = open_labels(side["label"], tokens) if "label" in side else None
    if options.pack_impl == "packed":
        return GPT2Dataset(part.name, part.prefix, part.documents, tokens, num_samples,
                           seq_length, seed, cache_dir=cache_dir, group=group, labels=labels)
    rewards = read_rewards(side["reward"], tokens) if "reward" in side else None
    return DocumentDataset(part.name, part.prefix, part.documents, tokens, num_samples,
                           seq_length, seed, options.pack_impl, options.allow_chopped, labels,
                           rewards, pad_id=options.pad_id)


# ----------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------


_CLAMPS_SAID: set[tuple[int, int]] = set()


def clamp_num_workers(num_workers: int) -> int:
    """`num_workers` limited to the available CPUs, with a warning when lowered (A10)."""
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    cpus = available_cpus()
    if num_workers > cpus:
        if (num_workers, cpus) not in _CLAMPS_SAID:  # once, not for each of the three splits
            _CLAMPS_SAID.add((num_workers, cpus))
            logger.warning("num_workers=%d exceeds the %d available CPUs; using %d", num_workers,
                           cpus, cpus)
        return cpus
    return num_workers


def collate_text(samples: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack samples into {key: tensor [b, s + 1]} for each key of the samples ("text", and
    "label", "segment", "reward", "pos", ... where the dataset gives them)."""
    lengths = {len(v) for s in samples for v in s.values()}
    if len(lengths) != 1:
        raise ValueError(f"samples of one batch have different lengths {sorted(lengths)}")
    return {key: torch.from_numpy(np.stack([s[key] for s in samples]))
            for key in samples[0]}


def build_data_loader(dataset, consumed_samples: int, micro_batch_size: int,
                      data_parallel_rank: int, data_parallel_size: int, num_workers: int,
                      drop_last: bool = True, pin_memory: bool = False):
    """A DataLoader of this rank's micro-batches from `consumed_samples` on; None for None.

    Iterating it leaves torch's global random state alone (samples involve no randomness).
    """
    if dataset is None:
        return None
    sampler = PretrainingSampler(len(dataset), consumed_samples, micro_batch_size,
                                 data_parallel_rank, data_parallel_size, drop_last=drop_last)
    if drop_last and len(sampler) == 0:  # A9
        raise ValueError(
            f"dataset {getattr(dataset, 'name', '')!r} has {len(dataset) - consumed_samples} "
            f"samples left, fewer than one global micro-batch of micro_batch_size "
            f"({micro_batch_size}) * data_parallel_size ({data_parallel_size}); use more data "
            "or a smaller batch")
    # Its own generator: starting an iteration draws a worker seed from it, and a draw from
    # torch's global generator would shift dropout, so a resumed run would diverge.
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler,
                                       num_workers=clamp_num_workers(num_workers),
                                       collate_fn=collate_text, pin_memory=pin_memory,
                                       generator=torch.Generator().manual_seed(0),
                                       worker_init_fn=ignore_stop_signals)


def ignore_stop_signals(_worker_id: int) -> None:
    """In a loader worker process: leave the stop requests SIGINT and SIGUSR1 to the training
    process (megatron.safety.signals). A launcher may signal every process of a rank (mpirun
    passes SIGUSR1 on to the whole process group, SLURM's --signal=USR1@T reaches every process
    of the step); a loader worker ended by one would fail the step that should save the
    checkpoint. SIGTERM keeps its default: it is how multiprocessing ends loader workers when
    their training process exits."""
    import signal

    for signum in (signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)


def cyclic_iter(iterable: Iterable) -> Iterator:
    """Iterate `iterable` again and again; an empty pass raises instead of spinning (A9)."""
    while True:
        empty = True
        for item in iterable:
            empty = False
            yield item
        if empty:
            raise RuntimeError("the data loader yielded no batch; its dataset has fewer samples "
                               "than one global micro-batch")
