"""Writing a checkpoint that holds model weights only (no optimizer, RNG or engine state), e.g.
weights converted from Hugging Face, in the layout `weights.full_weights` and the loader read.

    step_dir = write_weights_checkpoint(Path(save), 0, canonical, args, tp=2)

    <save>/global_step<N>/
        layer_<LL>-model_<TT>-model_states.pt   {param path: tensor} of layer LL, tensor rank TT
        config.yml                              the resolved config, model_parallel_size = tp
        manifest.json                           contents {"optimizer": false, "rng": false,
                                                "engine": false}: no DeepSpeed engine wrote it
    <save>/latest                               "global_step<N>"

Layer indices are the canonical ones (0 embedding, 1..L transformer layers, L+1 final norm,
L+2 untied LM head), as DeepSpeed's pipeline writes them; each tensor-parallel weight is split
with the same rule training uses (partition.Sharding). Like a training save, the files are
written into `<save>/.staging-global_step<N>/`, hashed and fsynced, then the directory is
renamed and `latest` replaced atomically: an interrupted write leaves no checkpoint behind.
A save directory that already holds a checkpoint at the same or a later iteration is refused
(`check_new_iteration`), so `latest` never moves back to an older step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from megatron.checkpointing.durable import (fsync_dir, rename, replace_text, write_bytes,
                                            write_torch)
from megatron.checkpointing.layout import (CONFIG_NAME, LATEST, saved_iterations, staging_tag,
                                          tag_for)
from megatron.checkpointing.manifest import FileEntry, Manifest, write_manifest
from megatron.checkpointing.model_shape import describe_shape
from megatron.model.partition import Sharding
from megatron.monitoring.logger import get_logger
from megatron.mpu.groups import TensorParallel

log = get_logger(__name__)

CONTENTS = {"optimizer": False, "rng": False, "engine": False}


def layer_file(layer: int, tp_rank: int) -> str:
    """DeepSpeed's pipeline file name for one layer's weights on one tensor rank."""
    return f"layer_{layer:02d}-model_{tp_rank:02d}-model_states.pt"


def layer_shards(canonical: dict[str, torch.Tensor], tp: int, sharding: Sharding
                 ) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """(layer, tensor rank) -> {param path: this rank's part} for every layer with tensors.
    Each part is its own copy, so a file holds only its own bytes."""
    out: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for name, tensor in canonical.items():
        layer, path = name.split(".", 1)
        for rank in range(tp):
            view = TensorParallel(rank=rank, size=tp)  # for splitting only: no process group
            part = sharding.local(tensor, name, view)
            out.setdefault((int(layer), rank), {})[path] = part.detach().clone()
    return out


def describe_weights(args, tp: int, canonical: dict[str, torch.Tensor]) -> dict:
    """The manifest's `run` for a weights-only checkpoint: degrees that no engine chose are
    None; the model shape as `model_shape.describe_shape` gives it."""
    return {"tp": tp, "pp": 1, "pipe_parallel_size": args.parallelism.pipe_parallel_size,
            "dp": None, "world_size": None, "zero_stage": None, "precision": args.derived.precision,
            **describe_shape(args, int(canonical["0.word_embeddings.weight"].shape[0]))}


def config_for_tp(args, tp: int):
    """`args` with model_parallel_size = tp, validated for its own world size when that holds
    tp x pp ranks, else for tp x pp (the config records the layout, not a world)."""
    if tp < 1:
        raise ValueError(f"model_parallel_size({tp}) must be at least 1.")
    if args.parallelism.model_parallel_size == tp:
        return args
    per_replica = tp * max(1, args.parallelism.pipe_parallel_size)
    world = args.derived.world_size
    return args.replace(model_parallel_size=tp,
                        world_size=world if world % per_replica == 0 else per_replica)


def write_weights_checkpoint(root: Path, iteration: int, canonical: dict[str, torch.Tensor],
                             args, tp: int) -> Path:
    """Write `canonical` (full tensors) as `<root>/global_step<iteration>/` split for `tp`
    tensor-parallel ranks, and point `<root>/latest` at it. Refused as `check_new_iteration`
    says: an existing checkpoint is never overwritten, nor `latest` moved back."""
    root, tag = Path(root), tag_for(iteration)
    target, stage = root / tag, root / staging_tag(tag)
    check_new_iteration(root, iteration)
    args = config_for_tp(args, tp)
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(stage, ignore_errors=True)  # what an interrupted write left
    stage.mkdir()
    try:
        files = _write_files(stage, canonical, args, tp)
        write_manifest(stage, Manifest(
            iteration=iteration, tag=tag, run=describe_weights(args, tp, canonical),
            contents=dict(CONTENTS), client_state={"iteration": iteration},
            config=args.to_dict(), files=files, versions={"torch": torch.__version__}))
        fsync_dir(stage)
        rename(stage, target)
        fsync_dir(root)
        replace_text(root / LATEST, tag)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    log.info("wrote weights-only checkpoint %s (model_parallel_size %d)", target, tp)
    return target


def check_new_iteration(root: Path, iteration: int) -> None:
    """Refuse writing `<root>/global_step<iteration>/` and pointing `latest` at it: ValueError
    for a negative iteration or when `root` holds a later checkpoint (the next run would resume
    from the older one), FileExistsError when that checkpoint exists. Reads directory names
    only, so it can run before any weight is read."""
    if iteration < 0:
        raise ValueError(f"--iteration {iteration} is negative; a checkpoint's iteration "
                         "(N of global_step<N>) is 0 or more")
    root, tag = Path(root), tag_for(iteration)
    newest = max(saved_iterations(root), default=None)
    if newest is not None and newest > iteration:
        raise ValueError(f"{root} already holds {tag_for(newest)}, later than {tag}: writing "
                         f"{tag} would point {root / LATEST} back to it and the next run would "
                         f"resume from {tag} instead of {tag_for(newest)}; choose another "
                         f"--output_dir, or --iteration above {newest}")
    if (root / tag).exists():
        raise FileExistsError(f"{root / tag} already exists; choose another iteration or output "
                              "directory (an existing checkpoint is never overwritten)")


def _write_files(stage: Path, canonical: dict[str, torch.Tensor], args, tp: int
                 ) -> dict[str, FileEntry]:
    """The layer files and config.yml in `stage`: name -> FileEntry (written by rank 0)."""
    files = {}
    sharding = Sharding.for_activation(args.model.activation)
    for (layer, rank), state in sorted(layer_shards(canonical, tp, sharding).items()):
        record = write_torch(state, stage / layer_file(layer, rank))
        files[layer_file(layer, rank)] = FileEntry(record.size, record.sha256, 0)
    record = write_bytes(args.to_yaml().encode("utf-8"), stage / CONFIG_NAME)
    files[CONFIG_NAME] = FileEntry(record.size, record.sha256, 0)
    return files
