"""Compare a run's memory estimate with what this machine has, before any worker starts (A30, A31).

    check_memory(args, "train.py", padded_vocab, workers_here=2)   # logs the estimate; raises
                                                                   # RuntimeError when it cannot fit

The available figure, per worker, and its source are stated in every message (A31): on a
machine with CUDA each worker has a GPU of torch.cuda.get_device_properties(i).total_memory
(the smallest of the GPUs the workers use); on CPU the workers share the host's MemAvailable
(/proc/meminfo, read through psutil), divided by the number of workers started here. With a
hostfile the workers run elsewhere: the estimate is logged but not compared.
`memory_check: warn` logs the refusal as a warning and goes on; `memory_check: false` only logs
the estimate.
"""

from __future__ import annotations

from megatron.monitoring.logger import get_logger
from megatron.host import cuda_available
from megatron.training.memory_estimate import (DTYPE_BYTES, Layout, MemoryEstimate, gib,
                                             inference_estimate, training_estimate)

log = get_logger(__name__)

INFERENCE_SCRIPTS = ("generate.py", "eval.py")

# what to change when a term is the biggest one
ADVICE = {
    "optimizer states": "raise the ZeRO stage (zero_optimization.stage 1 splits optimizer states "
                        "and the fp32 copy over data-parallel ranks) with more workers, or split "
                        "the model with model_parallel_size / pipe_parallel_size",
    "gradients": "use ZeRO stage 2 (splits gradients over data-parallel ranks) with more "
                 "workers, or split the model with model_parallel_size / pipe_parallel_size",
    "weights": "split the model with model_parallel_size / pipe_parallel_size, or use ZeRO "
               "stage 3 with more workers",
    "activations": "set checkpoint_activations: true, lower train_micro_batch_size_per_gpu or "
                   "seq_length, or raise model_parallel_size (with sequence_parallel)",
    "logits and loss": "lower train_micro_batch_size_per_gpu or raise model_parallel_size (the "
                       "vocabulary is split over tensor-parallel ranks)",
    "KV cache": "lower generation_batch_size, or set recompute: true (no cache)",
    "logits": "lower generation_batch_size / eval_batch_size or raise model_parallel_size",
}
# the ZeRO stage that splits each term over data-parallel ranks
ZERO_SPLITS = {"optimizer states": 1, "fp32 master copy": 1, "gradients": 2, "weights": 3}
ADVICE["fp32 master copy"] = ADVICE["optimizer states"]
ADVICE["backward working set"] = ADVICE["activations"]
ADVICE["checkpoint being read"] = ADVICE["weights"]


def run_device() -> str:
    """Where local workers compute: "cuda" when this machine has a GPU, else "cpu"."""
    return "cuda" if cuda_available() else "cpu"


def available_per_worker(device: str, workers: int) -> tuple[int, str]:
    """(bytes one worker may use, where the figure comes from)."""
    if device == "cuda":
        import torch

        count = min(max(workers, 1), torch.cuda.device_count())
        props = min((torch.cuda.get_device_properties(i) for i in range(count)),
                    key=lambda p: p.total_memory)
        return int(props.total_memory), (f"torch.cuda.get_device_properties total memory of "
                                         f"{props.name}, one GPU per worker")
    import psutil

    free = int(psutil.virtual_memory().available)
    return free // max(workers, 1), (f"MemAvailable {gib(free)} of /proc/meminfo shared by "
                                     f"{workers} worker(s) on this host")


def estimate_for(args, script: str, padded_vocab: int, device: str) -> MemoryEstimate:
    """The estimate that applies to `script`: all terms for training, weights and the KV cache
    (and logits) for generation and eval."""
    if script in INFERENCE_SCRIPTS:
        precision = args.derived.precision
        dtype_bytes = 4 if precision == "fp16" and device == "cpu" else DTYPE_BYTES[precision]
        return inference_estimate(args, padded_vocab, args.parallelism.model_parallel_size,
                                  device, dtype_bytes, script)
    return training_estimate(args, padded_vocab, Layout.from_args(args), device)


def padded_vocab(args, vocab_size: int | None = None) -> int:
    """The padded vocabulary of a new run: from `vocab_size`, else from the config's tokenizer."""
    from megatron.neox_arguments import padded_vocab_size

    if vocab_size is None:
        from megatron.tokenizer import build_tokenizer

        tok = args.tokenizer
        vocab_size = build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file).vocab_size
    return padded_vocab_size(vocab_size, args.model.make_vocab_size_divisible_by,
                             args.parallelism.model_parallel_size)


def describe_estimate(args, script: str, vocab_size: int | None = None,
                      device: str | None = None) -> tuple[list[str], bool]:
    """(report lines, whether it fits one worker of this machine) for tools/memory_estimate.py."""
    device = device or run_device()
    vocab = padded_vocab(args, vocab_size)
    est = estimate_for(args, script, vocab, device)
    d = args.derived
    layout = f"tp={est.layout.tp}" if script in INFERENCE_SCRIPTS else est.layout.describe()
    lines = [f"memory estimate for {script}, per worker, GiB = 2^30 bytes",
             f"  layout: {layout} (world size {d.world_size}), {d.precision}, "
             f"{device}" + (f", pipeline stage {est.stage} (the largest)" if est.layout.pp > 1 else ""),
             f"  parameters on this rank: {est.params:,} (padded vocabulary {vocab})"]
    lines += est.table()
    if est.activation_note:
        lines.append(f"  attention: {est.activation_note}")
    workers = d.num_gpus
    if device == "cuda" and run_device() != "cuda":
        lines.append("  available: not compared (this machine has no CUDA GPU)")
        return lines, True
    free, source = available_per_worker(device, workers)
    fits = est.total <= free
    lines.append(f"  available here: {gib(free)} per worker ({source}): "
                 + ("fits" if fits else "does not fit"))
    return lines, fits


def check_memory(args, script: str, padded_vocab: int, workers_here: int,
                 device: str | None = None, available: tuple[int, str] | None = None
                 ) -> MemoryEstimate:
    """Log the estimate; raise RuntimeError (or warn, with memory_check: warn) when it exceeds
    what one worker has here."""
    device = device or run_device()
    est = estimate_for(args, script, padded_vocab, device)
    layout = f"tp={est.layout.tp}" if script in INFERENCE_SCRIPTS else est.layout.describe()
    where = f", pipeline stage {est.stage}" if est.layout.pp > 1 else ""
    log.info("memory estimate for %s (%s%s, %s): %s", script, layout, where, device,
             est.summary())
    mode = args.launcher.memory_check
    if mode is False:
        return est
    if args.launcher.hostfile:
        log.info("memory estimate not compared: the workers run on the hostfile's hosts")
        return est
    free, source = available or available_per_worker(device, workers_here)
    if est.total > free:
        message = refusal(est, free, source, workers_here, shared=device == "cpu")
        if mode == "warn":
            log.warning("%s", message)
        else:
            raise RuntimeError(message)
    return est


def refusal(est: MemoryEstimate, free: int, source: str, workers: int,
            shared: bool = False) -> str:
    """The refusal's line; `shared`: the workers share the machine's memory (CPU), so fewer of
    them have more each."""
    name, _ = est.biggest()
    advice = ADVICE.get(name, "use a machine with more memory")
    if name in ZERO_SPLITS and est.layout.dp == 1:
        advice = (f"ZeRO splits it over data-parallel ranks and this run has one, so add "
                  f"workers (num_gpus) with ZeRO stage >= {ZERO_SPLITS[name]}, or split the "
                  "model with model_parallel_size / pipe_parallel_size")
    elif shared and workers > 1:
        advice += (f"; or start fewer than {workers} workers (num_gpus): they share this "
                   "machine's memory")
    return (f"the model needs {est.summary()} but this machine has {gib(free)} available for "
            f"{workers} worker(s) ({source}); the biggest term is {name}: {advice}; or set "
            "memory_check: warn (or false) to start anyway (A30)")

