"""One training rank that measures its own peak resident memory over a few real steps.

    python -m tests.training.memory_worker STEPS CONFIG.yml [more.yml] [key=value ...]

Joins a one-rank gloo group, keeps freed host memory as train.py's CPU workers do
(megatron/training/host_memory.py), reads its resident memory (the baseline: Python, torch,
DeepSpeed and the process group, no model), builds the real DeepSpeed engine of the config
and runs STEPS training steps on random tokens while a thread samples the resident set size
every 2 ms. Prints one JSON line: baseline and peak RSS in bytes, the parameters on the rank
and the estimate's terms for the same config (megatron/training/memory_estimate.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import psutil


class PeakSampler(threading.Thread):
    """Highest RSS seen by sampling, and by the kernel's own high-water mark."""

    def __init__(self):
        super().__init__(daemon=True)
        self.process, self.peak, self.done = psutil.Process(), 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> int:
        self.done.set()
        self.join()
        from megatron.monitoring.memory_profile import peak_rss_bytes

        return max(self.peak, peak_rss_bytes())


def main(argv=None) -> int:
    argv = argv or sys.argv[1:]
    steps, rest = int(argv[0]), argv[1:]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    import torch

    from megatron.entry import split_command_line
    from megatron.mpu.initialize import init_distributed
    from megatron.neox_arguments import NeoXArgs
    from megatron.training.memory_check import padded_vocab
    from megatron.training.memory_estimate import training_estimate
    from megatron.training.batch import BatchOptions, model_inputs
    from megatron.training.host_memory import keep_freed_memory
    from megatron.training.loop import setup_engine
    from megatron.training.step import train_step

    args = NeoXArgs.from_ymls(*split_command_line(rest)).with_world_size(1)
    init_distributed("gloo", 2, args.launcher)
    keep_freed_memory()  # as pretrain() does on the CPU accelerator
    sampler = PeakSampler()
    baseline = sampler.process.memory_info().rss
    sampler.start()
    engine, _topology, tokenizer, config = setup_engine(args)
    gen = torch.Generator().manual_seed(0)
    mb, s = args.derived.train_micro_batch_size_per_gpu, config.seq_length

    def batches():
        while True:
            text = torch.randint(0, tokenizer.vocab_size, (mb, s + 1), generator=gen)
            yield model_inputs({"text": text}, BatchOptions(tokenizer.eod))

    data = batches()
    for _ in range(steps):
        train_step(engine, data)
    peak = sampler.stop()
    est = training_estimate(args, padded_vocab(args, tokenizer.vocab_size))
    params = sum(p.numel() for p in engine.engine.module.parameters())
    print(json.dumps({"baseline": baseline, "peak": peak, "params": params,
                      "estimate_params": est.params, "terms": dict(est.terms)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
