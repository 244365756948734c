"""Peak extra memory of one training step under each activation checkpointing option, on CPU in
fp32, for a 125M-class model (configs/125M.yml shapes at a short sequence).

    python bench/activation_memory.py                       # seq 512, micro-batch 1
    python bench/activation_memory.py --seq 1024 --micro 2

Each case runs in fresh processes (tp2 cases on 2 gloo ranks). A case builds the model, runs
one forward and backward so gradients exist, then measures the next step: "peak extra" is the
process's peak resident memory during that step minus its resident memory before it (rank 0's
for tp2), that is the activations kept for backward plus temporaries, with weights and
gradients excluded. glibc is told to serve every allocation over 64 KiB with mmap so freed
tensors leave the resident set and the peak is the step's own. Ratios are against "none" (and,
for tp2 cases, against "tp2 none") measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = {  # name: (tensor-parallel size, activation checkpointing keys or None)
    "none": (1, None),
    "checkpoint_activations": (1, {}),
    "checkpoint_num_layers=2": (1, {"checkpoint_num_layers": 2}),
    "tp2 none": (2, None),
    "tp2 checkpoint_activations": (2, {}),
    "tp2 checkpoint_activations+partition_activations": (2, {"partition_activations": True}),
}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _parallelism(keys: dict) -> SimpleNamespace:
    base = dict(checkpoint_activations=True, checkpoint_num_layers=1, partition_activations=False,
                contiguous_checkpointing=False, checkpoint_in_cpu=False,
                synchronize_each_layer=False, pipe_parallel_size=0)
    return SimpleNamespace(**{**base, **keys})


def _model_config(seq: int, tp: int):
    from megatron.model.config import model_config_from_args
    from megatron.neox_arguments import NeoXArgs, padded_vocab_size

    args = NeoXArgs.from_ymls([ROOT / "configs/125M.yml"], {"seq_length": seq})
    return model_config_from_args(args, padded_vocab_size(50257, 128, tp))


def _case(rank: int, world: int, port: int, keys, seq: int, micro: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import deepspeed
    import torch

    from megatron.model.gpt import GPTModel, lm_loss
    from megatron.model.recompute import Recompute, configure_activation_checkpointing
    from megatron.mpu.deepspeed_adapter import DeepSpeedMPU
    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.initialize import disable_deepspeed_shm_allreduce
    from megatron.mpu.topology import Topology

    torch.set_num_threads(1)
    disable_deepspeed_shm_allreduce()  # its shared-memory buffer would count as step memory
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    groups = ProcessGroups.build(Topology(tp=world, pp=1, dp=1))
    tp = groups.tensor_parallel(seed=1234)
    config = _model_config(seq, world)
    recompute = None
    if keys is not None:
        par = _parallelism(keys)
        configure_activation_checkpointing(par, config.num_layers, DeepSpeedMPU(groups))
        recompute = Recompute(par.checkpoint_num_layers, tp)
    model = GPTModel(config, tp, recompute).train()
    tokens = torch.randint(0, 50257, (micro, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(seq).expand(micro, seq)

    def step() -> None:
        logits = model(tokens, positions)
        lm_loss(logits, (tokens, torch.ones(micro, seq)), tp).backward()

    step()  # gradients now exist; the next step accumulates into them in place
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    step()
    results[rank] = (_status_kib("VmHWM") - before) * 1024
    torch.distributed.destroy_process_group()


def measure(keys, tp: int, seq: int, micro: int) -> int:
    """Rank 0's peak extra bytes over one step of the case."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=_case, args=(r, tp, port, keys, seq, micro, results))
                 for r in range(tp)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs) or 0 not in results:
            raise RuntimeError(f"case with tp={tp} {keys} failed")
        return results[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro", type=int, default=1)
    opts = parser.parse_args(argv)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # inherited by the spawned processes
    print(f"125M shapes (configs/125M.yml), seq {opts.seq}, micro-batch {opts.micro}, fp32, CPU")
    peaks = {}
    for name, (tp, keys) in CASES.items():
        peaks[name] = measure(keys, tp, opts.seq, opts.micro)
    print(f"{'case':50s} {'peak extra MiB':>15s} {'/ none':>7s} {'/ tp2 none':>11s}")
    for name, peak in peaks.items():
        vs_tp2 = f"{peak / peaks['tp2 none']:.2f}" if name.startswith("tp2") else ""
        print(f"{name:50s} {peak / 2**20:15.1f} {peak / peaks['none']:7.2f} {vs_tp2:>11s}")


if __name__ == "__main__":
    main()
