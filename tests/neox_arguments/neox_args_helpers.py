"""Helpers shared by the config tests (import after conftest.py has put the repo on sys.path)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"

# The smallest config that validates: a 2-layer model with one micro batch size.
BASE = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "max_position_embeddings": 32,
    "train_iters": 10,
    "train_micro_batch_size_per_gpu": 2,
}


def make(world_size=None, **values):
    """NeoXArgs from BASE updated with `values`."""
    from megatron.neox_arguments import NeoXArgs

    return NeoXArgs.from_dict({**BASE, **values}, source="test", world_size=world_size)
