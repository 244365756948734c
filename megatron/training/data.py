"""Datasets and loaders for a run: sample counts per split, this rank's share, micro-batch tuples."""

from __future__ import annotations

import time

from megatron.data.loaders import build_data_loader, build_train_valid_test_datasets
from megatron.data.options import SampleCounts, sample_options, token_paths
from megatron.monitoring.logger import get_logger
from megatron.training.objectives import BatchOptions, Objective

log = get_logger(__name__)


def build_datasets(args, counts: SampleCounts, vocab_size: int, pad_id: int = 0):
    """(train, valid, test) datasets; a split asked for zero samples is None.

    Every token id is checked against the tokenizer's `vocab_size` (A12).
    """
    d = args.data
    train_paths, valid_paths, test_paths = token_paths(args)
    return build_train_valid_test_datasets(
        data_path=d.data_path, train_data_paths=train_paths,
        valid_data_paths=valid_paths, test_data_paths=test_paths,
        train_data_weights=d.train_data_weights, valid_data_weights=d.valid_data_weights,
        test_data_weights=d.test_data_weights, weight_by_num_documents=d.weight_by_num_documents,
        weighted_sampler_alpha=d.weighted_sampler_alpha, split=d.split,
        seq_length=args.model.seq_length, seed=args.training.seed,
        train_valid_test_num_samples=(counts.train, counts.valid, counts.test),
        cache_dir=d.data_cache_dir, skip_warmup=not d.mmap_warmup, vocab_size=vocab_size,
        global_batch_size=args.derived.train_batch_size, options=sample_options(args, pad_id))


def micro_batch_iterator(dataset, consumed_samples: int, args, dp_rank: int, dp_size: int,
                         options: BatchOptions, objective: Objective, reference=None):
    """Micro-batch (inputs, targets) for this data-parallel rank, starting after
    `consumed_samples`, as `objective` reads them; with `reference` (a ReferenceModel) its
    log-probabilities fill the targets' reference slot."""
    if dataset is None:
        return None
    loader = build_data_loader(dataset, consumed_samples=consumed_samples,
                               micro_batch_size=args.derived.train_micro_batch_size_per_gpu,
                               data_parallel_rank=dp_rank, data_parallel_size=dp_size,
                               num_workers=args.data.num_workers)
    batches = (objective.prepare(batch, options) for batch in loader)
    if reference is not None:
        batches = (reference.fill(objective, inputs, targets) for inputs, targets in batches)
    return TimedIterator(batches)


class TimedIterator:
    """Wraps an iterator and accumulates the seconds spent waiting in `next` (loader wait time)."""

    def __init__(self, iterator):
        self._it = iter(iterator)
        self.wait_seconds = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self._it)
        finally:
            self.wait_seconds += time.perf_counter() - start

    def take_wait(self) -> float:
        """Seconds waited since the last call."""
        waited, self.wait_seconds = self.wait_seconds, 0.0
        return waited
