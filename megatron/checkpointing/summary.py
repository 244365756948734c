"""A checkpoint described for people: what it holds, how it was trained, whether it is intact.

    lines, problems = describe_checkpoint(Path("checkpoints/tiny"), iteration=None, verify=True)

Reads the manifest only (and, with `verify`, hashes every file); no torch.distributed, no
DeepSpeed, nothing unpickled. A checkpoint GPT-NeoX wrote has no manifest: its description
comes from its model file (neox_format.describe), and it has no checksums to verify.
"""

from __future__ import annotations

import os
from pathlib import Path

from megatron.checkpointing.errors import CorruptFileError
from megatron.checkpointing import neox_format
from megatron.checkpointing.locate import read_any_manifest, step_directory
from megatron.checkpointing.manifest import check_files
from megatron.checkpointing.model_shape import SHAPE_KEYS


def describe_checkpoint(path: Path, iteration: int | None = None, verify: bool = False
                        ) -> tuple[list[str], list[str]]:
    """(lines describing the checkpoint, problems found); a missing or unreadable manifest is
    a problem, not an exception."""
    step = step_directory(Path(path), iteration)
    try:
        manifest = read_any_manifest(step)
    except CorruptFileError as err:
        return [f"checkpoint {step}"], [str(err)]
    run, state = manifest.run, manifest.client_state
    # a checkpoint written from weights alone (an import) has no data-parallel layout
    layout = ", ".join(f"{k} {run[k]}" for k in ("tp", "pp", "dp", "zero_stage", "precision")
                       if run.get(k) is not None)
    shape = ", ".join(f"{k} {run[k]}" for k in SHAPE_KEYS if k in run and not _unused(k, run))
    held = ["weights"] + [k for k, v in manifest.contents.items() if v is True and k != "engine"]
    consumed = state.get("consumed_train_samples")
    lines = [f"checkpoint {step} (format {manifest.format_version})",
             f"iteration {manifest.iteration}" + (f", consumed samples {consumed}"
                                                  if consumed is not None else ""),
             f"layout: {layout}", f"model: {shape}", f"holds: {', '.join(held)}",
             _files_line(step, manifest),
             "written with " + ", ".join(f"{k} {v}" for k, v in manifest.versions.items())]
    if neox_format.is_neox(manifest):
        problems = neox_format.verify(step, manifest)
        lines[0] += ", written by GPT-NeoX"
        if manifest.contents.get("optimizer_note"):
            lines.append(f"optimizer state not read: {manifest.contents['optimizer_note']}")
        lines.append(f"{len(problems)} problem(s)" if problems else
                     "every file GPT-NeoX writes is present (it records no checksums)")
        return lines, problems
    problems = check_files(step, manifest, manifest.files if verify else (),
                           threads=min(4, os.cpu_count() or 1))
    lines.append(("verified: every file matches its size and sha256" if verify else
                  "sizes checked (--verify also hashes every file)") if not problems else
                 f"{len(problems)} problem(s)")
    return lines, problems


def _files_line(step: Path, manifest) -> str:
    """The file count and size the manifest records, and the size on disk where it differs
    (a truncated or missing file)."""
    recorded = manifest.total_bytes
    on_disk = sum((step / name).stat().st_size for name in manifest.files
                  if (step / name).is_file())
    line = f"files: {len(manifest.files)}, {recorded / 2**20:.1f} MiB"
    if on_disk != recorded:
        line += f" recorded, {on_disk / 2**20:.1f} MiB on disk ({on_disk - recorded:+,} bytes)"
    return line


def _unused(key: str, run: dict) -> bool:
    """A shape key that says nothing of this model: MoE keys of a dense one, Mamba keys of one
    without Mamba layers."""
    if key.startswith("moe_"):
        return run.get("moe_num_experts", 1) == 1
    if key.startswith("mamba_"):
        return not run.get("mamba_layers")
    return False
