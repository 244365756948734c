"""Metadata: what a checkpoint's run looked like, and how this run can load it (A23).

`describe_run` records the parallel degrees, ZeRO stage, precision and model shape in the
manifest. The model shape must match. A different layout (tensor / pipeline / data-parallel
degree, ZeRO stage, fp32 vs bf16) is loaded by resharding (reshard.py); `layout_changes` says
what differs.
"""

from __future__ import annotations

from megatron.checkpointing import collectives
from megatron.checkpointing.errors import CheckpointMismatchError
from megatron.checkpointing.manifest import FORMAT_VERSION
from megatron.checkpointing.optimizer_layouts import full_shape
from megatron.checkpointing.model_shape import shape_mismatches
_NAMES = {"tp": "model_parallel_size (tp)", "pipe_parallel_size": "pipe_parallel_size",
          "dp": "data-parallel size", "zero_stage": "zero_optimization.stage",
          "precision": "precision", "ep": "moe_expert_parallel_size"}


def padded_vocab_size(module, tp: int) -> int | None:
    """Rows of the word embedding times tp (the embedding may live on another pipeline stage:
    collective over all ranks)."""
    local = None
    for name, param in module.named_parameters():
        if name.endswith("word_embeddings.weight"):
            local = int(full_shape(param)[0]) * tp  # ZeRO 3: the full shape
            break
    found = [v for v in collectives.all_gather(local) if v is not None]
    return max(found) if found else None


def describe_run(engine) -> dict:
    """The manifest's `run`: this run's degrees, ZeRO stage, precision and model shape (from
    `engine.run`, see run.py). Collective (vocab lookup)."""
    run, topo = engine.run, engine.topology
    described = {"tp": topo.tp, "pp": topo.pp, "pipe_parallel_size": run.pipe_parallel_size,
                 "dp": topo.dp, "world_size": topo.world_size, "ep": topo.ep,
                 "zero_stage": run.zero_stage, "precision": run.precision, **run.shape,
                 "padded_vocab_size": padded_vocab_size(engine.engine.module, topo.tp)}
    if run.cpu_products:  # what a resumed run with cpu_matmul_precision: auto keeps
        described["cpu_matmul_precision"] = run.cpu_products
    return described


def dp_change_supported(saved: dict, current: dict) -> bool:
    """Whether the saved optimizer state loads at another data-parallel size: ZeRO 0 keeps the
    whole optimizer state in one file; with bf16 or ZeRO >= 1 it is partitioned by dp rank."""
    return all(r.get("zero_stage") == 0 and r.get("precision") != "bf16" for r in (saved, current))


def layout_changes(saved: dict, current: dict) -> list[str]:
    """`name: checkpoint X, this run Y` for each layout setting that differs (a data-parallel
    change DeepSpeed loads by itself, ZeRO 0 in fp32, is not one; nor is a setting the
    checkpoint does not record, as in one written from weights alone)."""
    out = []
    for key in ("tp", "pipe_parallel_size", "zero_stage", "precision", "dp", "ep"):
        a, b = saved.get(key), current.get(key)
        if key == "ep" and a is None and b is not None:
            a = 1  # written before expert parallelism existed
        if a is None or a == b or (key == "dp" and dp_change_supported(saved, current)):
            continue
        out.append(f"{_NAMES[key]}: checkpoint {a}, this run {b}")
    return out


def mismatches(saved: dict, current: dict, format_version: int) -> list[str]:
    """Why this run cannot load a checkpoint described by `saved` (empty when it can)."""
    out = []
    if format_version > FORMAT_VERSION:
        out.append(f"format_version: checkpoint {format_version}, this code reads up to "
                   f"{FORMAT_VERSION} (update the code)")
    return out + shape_mismatches(saved, current)


def check_compatible(saved: dict, current: dict, format_version: int, where: str) -> None:
    """Raise CheckpointMismatchError explaining every difference that prevents loading."""
    found = mismatches(saved, current, format_version)
    if not found:
        return
    raise CheckpointMismatchError(
        f"cannot load checkpoint {where}:\n  - " + "\n  - ".join(found)
        + "\nThe model shape must match the checkpoint's (use its model config); other parallel "
        "degrees, ZeRO stages and fp32/bf16 are resharded on load.")
