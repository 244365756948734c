"""`PretrainingSampler`: micro-batches of sample indices for one data-parallel rank, resumable.

Samples are taken in order from `consumed_samples` on, one global micro-batch of
`micro_batch_size * data_parallel_size` at a time; rank r gets the r-th slice of each. So the
ranks read disjoint samples, and a run restarted with the saved `consumed_samples` continues with
exactly the samples the interrupted run would have read next (A18).
"""

from __future__ import annotations

from typing import Iterator


class PretrainingSampler:
    """Yields lists of `micro_batch_size` sample indices for `data_parallel_rank`.

    With `drop_last=False` the final, partial global micro-batch is split too; ranks may then get
    a short batch or none, so keep the default for training.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, drop_last: bool = True):
        for name, value, low in (("total_samples", total_samples, 1),
                                 ("micro_batch_size", micro_batch_size, 1),
                                 ("data_parallel_size", data_parallel_size, 1),
                                 ("consumed_samples", consumed_samples, 0)):
            if int(value) != value or value < low:
                raise ValueError(f"sampler {name} must be an integer >= {low}, got {value}")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank ({data_parallel_rank}) must be in "
                             f"0..{data_parallel_size - 1} for data_parallel_size "
                             f"({data_parallel_size})")
        self.total_samples, self.consumed_samples = int(total_samples), int(consumed_samples)
        self.micro_batch_size = int(micro_batch_size)
        self.data_parallel_rank, self.data_parallel_size = data_parallel_rank, data_parallel_size
        self.drop_last = drop_last
        step = self.global_micro_batch
        if self.consumed_samples % step:
            raise ValueError(
                f"consumed_samples ({consumed_samples}) is not a multiple of micro_batch_size "
                f"({micro_batch_size}) * data_parallel_size ({data_parallel_size}) = {step}; the "
                "checkpoint was written with other batch settings, so ranks would read "
                "overlapping samples"
            )
        if self.consumed_samples >= self.total_samples:
            raise ValueError(
                f"consumed_samples ({consumed_samples}) >= the dataset's {total_samples} samples:"
                " the data is used up; build the dataset with more samples (train_iters) or "
                "start from an earlier checkpoint"
            )

    @property
    def global_micro_batch(self) -> int:
        return self.micro_batch_size * self.data_parallel_size

    def __len__(self) -> int:
        """Micro-batches this rank will yield."""
        remaining = self.total_samples - self.consumed_samples
        full, rest = divmod(remaining, self.global_micro_batch)
        if self.drop_last:
            return full
        start = self.data_parallel_rank * self.micro_batch_size
        return full + (1 if rest > start else 0)

    def __iter__(self) -> Iterator[list[int]]:
        step, mbs = self.global_micro_batch, self.micro_batch_size
        offset = self.data_parallel_rank * mbs
        for begin in range(self.consumed_samples, self.total_samples, step):
            end = min(begin + step, self.total_samples)
            if end - begin < step and self.drop_last:
                return
            first = begin + offset
            if first < end:
                yield list(range(first, min(first + mbs, end)))
