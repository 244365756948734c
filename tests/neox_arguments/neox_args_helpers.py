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


# Shipped files merged after a model (tiny.yml stands in for one).
PARTIAL = {"configs/local_setup.yml", "configs/text_generation.yml", "configs/tiny_moe.yml",
           "configs/tiny_mamba.yml"}
LLAMA_TRAINING = "configs/llama/train_config.yml"
# Model files run with LLAMA_TRAINING, as GPT-NeoX's llama/README.md runs them (llemma/ files are
# complete run configs).
MODEL_ONLY = ("configs/llama/", "configs/llama2/", "configs/mistral/")
# Post-training runs of tiny.yml, complete with their data and outputs (no local_setup.yml).
POST_TRAINING = "configs/post-training/"


def stack(name: str) -> list[Path]:
    """The files the shipped config `name` runs with, as its header says: a partial file after a
    model, a model file before the LLaMA training settings; configs/local_setup.yml last (not
    after a post-training file, which names its own data)."""
    if name.startswith(POST_TRAINING):
        return [REPO / "configs/tiny.yml", REPO / name]
    if name in PARTIAL:
        names = ["configs/tiny.yml", name]
    elif name == LLAMA_TRAINING:
        names = ["configs/llama/7B.yml", name]
    elif name.startswith(MODEL_ONLY):
        names = [name, LLAMA_TRAINING]
    else:
        names = [name]
    return [REPO / n for n in names + ["configs/local_setup.yml"]]
