"""RNG for tensor-parallel regions: dropout on a rank's own heads must differ across tensor-
parallel ranks, while everything replicated must draw the same numbers on every rank.

The default torch generator (seeded identically on all ranks of a tensor-parallel group) serves
replicated regions; `TensorParallelRNG.fork()` switches to a per-rank stream for split regions.
"""

from __future__ import annotations

import contextlib

import torch

_OFFSET = 2718


class TensorParallelRNG:
    """A second random stream, seeded with seed + 2718 + tp_rank, swapped in by `fork()`."""

    def __init__(self, seed: int, tp_rank: int):
        self.seed = seed + _OFFSET + tp_rank
        self._cpu = torch.Generator().manual_seed(self.seed).get_state()
        self._cuda = None

    @contextlib.contextmanager
    def fork(self):
        """Run the body on the per-rank stream; the default stream is untouched by it."""
        saved = torch.get_rng_state()
        torch.set_rng_state(self._cpu)
        cuda_saved = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda_saved = torch.cuda.get_rng_state()
            if self._cuda is None:
                torch.cuda.manual_seed(self.seed)
            else:
                torch.cuda.set_rng_state(self._cuda)
        try:
            yield
        finally:
            self._cpu = torch.get_rng_state()
            torch.set_rng_state(saved)
            if cuda_saved is not None:
                self._cuda = torch.cuda.get_rng_state()
                torch.cuda.set_rng_state(cuda_saved)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "cpu": self._cpu, "cuda": self._cuda}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self._cpu, self._cuda = state["seed"], state["cpu"], state["cuda"]
