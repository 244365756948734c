"""One training rank that measures its own peak resident memory over a few real steps.

    python -m tests.training.memory_worker STEPS CONFIG.yml [more.yml] [key=value ...]
    python -m tests.training.memory_worker save CONFIG.yml [more.yml] [key=value ...]

Joins a one-rank gloo group, keeps freed host memory as train.py's CPU workers do
(megatron/training/host_memory.py), reads its resident memory (the baseline: Python, torch,
DeepSpeed and the process group, no model), builds the real DeepSpeed engine of the config,
loads `load` as train.py does (with `finetune`, the weights) and, where the objective needs one
(DPO), builds the reference model from that checkpoint as train.py does; then runs STEPS
training steps on random tokens (a plain run's text, or chosen/rejected pairs for dpo and rm,
made into the objective's own batches and scored by the reference; KTO's are not made here)
while a thread samples the resident set size every 2 ms. Prints one JSON line: baseline and peak
RSS in bytes, the parameters on the rank, the estimate's terms for the same config
(megatron/training/memory_estimate.py), the objective and whether a reference model was held.

`save` writes the freshly built engine's checkpoint (iteration 0) to `save` instead: the model
a DPO measurement starts from.
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


def random_batches(objective, options, mb: int, s: int, vocab: int, reference=None):
    """Endless micro-batches of random tokens in `objective`'s format: a text stream, or
    chosen and rejected streams whose first half is prompt (label -100), one document per row;
    with `reference`, its log-probabilities filled in as train.py's loader does."""
    import torch

    from megatron.training.objectives.dpo import PAIR_KEYS

    gen = torch.Generator().manual_seed(0)

    def stream():
        return torch.randint(0, vocab, (mb, s + 1), generator=gen)

    while True:
        if PAIR_KEYS in objective.batch_keys:
            batch = {}
            for side in ("pos", "neg"):
                tokens = stream()
                label = tokens.clone()
                label[:, : s // 2] = -100
                batch.update({side: tokens, f"{side}_label": label,
                              f"{side}_segment": torch.zeros_like(tokens)})
        else:
            batch = {"text": stream()}
        inputs, targets = objective.prepare(batch, options)
        if reference is not None:
            inputs, targets = reference.fill(objective, inputs, targets)
        yield inputs, targets


def main(argv=None) -> int:
    argv = argv or sys.argv[1:]
    mode, rest = argv[0], argv[1:]  # STEPS or "save"
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    from megatron.checkpointing.load import load_checkpoint
    from megatron.checkpointing.save import save_checkpoint
    from megatron.entry import split_command_line
    from megatron.mpu.initialize import init_distributed
    from megatron.neox_arguments import NeoXArgs
    from megatron.training.memory_check import padded_vocab
    from megatron.training.memory_estimate import training_estimate
    from megatron.training.batch import BatchOptions
    from megatron.training.host_memory import keep_freed_memory
    from megatron.training.loop import setup_engine
    from megatron.training.reference import build_reference, reference_source
    from megatron.training.step import train_step

    args = NeoXArgs.from_ymls(*split_command_line(rest)).with_world_size(1)
    init_distributed("gloo", 2, args.launcher)
    keep_freed_memory()  # as pretrain() does on the CPU accelerator
    sampler = PeakSampler()
    baseline = sampler.process.memory_info().rss
    sampler.start()
    engine, _topology, tokenizer, config = setup_engine(args)
    if mode == "save":
        print(save_checkpoint(engine, args.checkpoint, 0, {}), flush=True)
        return 0
    resumed = load_checkpoint(engine, args.checkpoint)  # {} without `load`
    reference = None
    if engine.objective.needs_reference:  # as train.py's _pretrain builds it
        reference = build_reference(args, engine, config, reference_source(args, resumed))
    data = random_batches(engine.objective, BatchOptions(tokenizer.eod),
                          args.derived.train_micro_batch_size_per_gpu, config.seq_length,
                          tokenizer.vocab_size, reference)
    for _ in range(int(mode)):
        train_step(engine, data)
    peak = sampler.stop()
    est = training_estimate(args, padded_vocab(args, tokenizer.vocab_size))
    params = sum(p.numel() for p in engine.engine.module.parameters())
    print(json.dumps({"baseline": baseline, "peak": peak, "params": params,
                      "estimate_params": est.params, "terms": dict(est.terms),
                      "objective": engine.objective.name, "reference": reference is not None}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
