"""A real DeepSpeed engine of a small GPT inside a test worker process (see tests/distributed.py),
trained on random tokens: what the in-process save/load tests drive."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.runs import ROOT

VOCAB = 256  # padded vocabulary of the test model
BASE = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
        "max_position_embeddings": 32, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1, "train_batch_size": None, "train_iters": 100,
        "hidden_dropout": 0.1,
        "checkpoint_factor": 1, "log_dir": "/tmp", "data_path": "unused", "vocab_file": "unused"}


def make_args(run_dir: Path, **overrides):
    """configs/tiny.yml shrunk, saving to and loading from run_dir/ckpt, for this world size."""
    import torch.distributed as dist

    from megatron.neox_arguments import NeoXArgs

    values = {**BASE, "save": str(run_dir / "ckpt"), "load": str(run_dir / "ckpt"), **overrides}
    values["num_gpus"] = dist.get_world_size()
    return NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"], values).with_world_size(
        dist.get_world_size())


def build(args, backend: str = "gloo"):
    """The training engine of `args` (seeded as the training loop seeds it); the first call in a
    process joins its process group with `backend`."""
    import torch.distributed as dist

    from megatron.model.config import model_config_from_args
    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.topology import Topology
    from megatron.training.engine import build_engine
    from megatron.training.loop import set_seeds

    import deepspeed

    from megatron.mpu.initialize import disable_deepspeed_shm_allreduce

    disable_deepspeed_shm_allreduce()  # no 69 MB /dev/shm buffer left per rank
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    set_seeds(args.training.seed)
    topology = Topology.from_world(dist.get_world_size(), args.parallelism.model_parallel_size,
                                   args.parallelism.pipe_parallel_size)
    return build_engine(args, model_config_from_args(args, VOCAB), ProcessGroups.build(topology))


def batches(seed: int, args, dp_rank: int):
    """Endless random micro-batches for data-parallel rank `dp_rank` (every tensor- and
    pipeline-parallel rank of it draws the same ones), in the model's input format."""
    from megatron.training.batch import BatchOptions, model_inputs

    gen = torch.Generator().manual_seed(seed * 100 + dp_rank)
    b, s = args.derived.train_micro_batch_size_per_gpu, args.model.seq_length
    while True:
        text = torch.randint(0, VOCAB, (b, s + 1), generator=gen)
        yield model_inputs({"text": text}, BatchOptions(eod_token=0))


def train(engine, args, steps: int, seed: int = 0) -> list[float]:
    import torch.distributed as dist

    from megatron.training.step import train_step

    data = batches(seed, args, engine.topology.coords(dist.get_rank()).data)
    return [train_step(engine, data) for _ in range(steps)]


def weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.engine.module.state_dict().items()}


def optimizer_state(engine) -> dict:
    return engine.engine.optimizer.state_dict()
