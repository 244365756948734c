"""Metadata: what a checkpoint's run looked like, and whether this run can load it (A23).

`describe_run` records the parallel degrees, ZeRO stage, precision and model shape in the
manifest; `mismatches` compares a saved description with this run's. Tensor- and pipeline-
parallel degrees and the model shape must match; the data-parallel degree may change where the
saved optimizer state does not depend on it (ZeRO stage 0 in fp32), or when only the weights are
loaded (finetune / no_load_optim).
"""

from __future__ import annotations

from megatron.checkpointing import collectives
from megatron.checkpointing.errors import CheckpointMismatchError
from megatron.checkpointing.manifest import FORMAT_VERSION

SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "intermediate_size", "padded_vocab_size")
_NAMES = {"tp": "model_parallel_size (tp)", "pipe_parallel_size": "pipe_parallel_size",
          "dp": "data-parallel size", "zero_stage": "zero_optimization.stage",
          "precision": "precision"}


def padded_vocab_size(module, tp: int) -> int | None:
    """Rows of the word embedding times tp (the embedding may live on another pipeline stage:
    collective over all ranks)."""
    local = None
    for name, param in module.named_parameters():
        if name.endswith("word_embeddings.weight"):
            local = int(getattr(param, "ds_shape", param.shape)[0]) * tp  # ZeRO 3: full shape
            break
    found = [v for v in collectives.all_gather(local) if v is not None]
    return max(found) if found else None


def describe_run(args, engine) -> dict:
    """This run's degrees, ZeRO stage, precision and model shape. Collective (vocab lookup)."""
    m, d, topo = args.model, args.derived, engine.topology
    return {"tp": topo.tp, "pp": topo.pp,
            "pipe_parallel_size": args.parallelism.pipe_parallel_size,
            "dp": topo.dp, "world_size": topo.world_size,
            "zero_stage": d.zero_stage, "precision": d.precision,
            "num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads, "num_kv_heads": d.num_kv_heads,
            "intermediate_size": d.intermediate_size,
            "padded_vocab_size": padded_vocab_size(engine.engine.module, topo.tp)}


def dp_change_supported(saved: dict, current: dict) -> bool:
    """Whether the saved optimizer state loads at another data-parallel size: ZeRO 0 keeps the
    whole optimizer state in one file; with bf16 or ZeRO >= 1 it is partitioned by dp rank."""
    return all(r.get("zero_stage") == 0 and r.get("precision") != "bf16" for r in (saved, current))


def mismatches(saved: dict, current: dict, format_version: int, module_only: bool) -> list[str]:
    """Why this run cannot load a checkpoint described by `saved` (empty when it can)."""
    out = []
    if format_version > FORMAT_VERSION:
        out.append(f"format_version: checkpoint {format_version}, this code reads up to "
                   f"{FORMAT_VERSION} (update the code)")
    for key in ("tp", "pipe_parallel_size") + SHAPE_KEYS:
        a, b = saved.get(key), current.get(key)
        if a is not None and b is not None and a != b:
            out.append(f"{_NAMES.get(key, key)}: checkpoint {a}, this run {b}")
    stages = (saved.get("zero_stage"), current.get("zero_stage"))
    if module_only and stages[0] != stages[1] and 3 in stages:
        out.append(f"{_NAMES['zero_stage']}: checkpoint {stages[0]}, this run {stages[1]} "
                   "(ZeRO stage 3 stores the weights themselves partitioned)")
    if module_only:
        return out
    for key in ("zero_stage", "precision"):
        if saved.get(key) != current.get(key):
            out.append(f"{_NAMES[key]}: checkpoint {saved.get(key)}, this run {current.get(key)} "
                       "(the optimizer state is stored differently)")
    if saved.get("dp") != current.get("dp") and not dp_change_supported(saved, current):
        out.append(f"{_NAMES['dp']}: checkpoint {saved.get('dp')}, this run {current.get('dp')} "
                   f"(with ZeRO stage {saved.get('zero_stage')} and {saved.get('precision')} the "
                   "optimizer state is partitioned by data-parallel rank)")
    return out


def check_compatible(saved: dict, current: dict, format_version: int, module_only: bool,
                     where: str) -> None:
    """Raise CheckpointMismatchError explaining every difference that prevents loading."""
    found = mismatches(saved, current, format_version, module_only)
    if not found:
        return
    raise CheckpointMismatchError(
        f"cannot load checkpoint {where}: it was saved by a run of another layout or shape:\n  - "
        + "\n  - ".join(found)
        + "\nLoading across tensor/pipeline-parallel degrees or model shapes (resharding) is not "
        "supported yet: run with the checkpoint's settings. A different data-parallel size, ZeRO "
        "stage or precision loads with finetune=true or no_load_optim=true (weights only, fresh "
        "optimizer).")
