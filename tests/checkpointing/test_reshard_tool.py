"""tools/ckpts/reshard.py rewrites the checkpoint it is asked for, or nothing: the one `latest`
names (or `iteration=<N>`), never an older one in place of a damaged one; never over an existing
checkpoint; never without optimizer state the optimizer did not declare; and a failed run leaves
no `save` directory behind."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.runs import ROOT, deepy, explain, launch_in_process, tiny_overrides


@pytest.fixture(scope="module")
def two_checkpoints(small_data, tmp_path_factory):
    """A save directory with global_step2 and global_step4 (latest) of configs/tiny.yml."""
    run = tmp_path_factory.mktemp("two-checkpoints")
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(*small_data, run, num_gpus=1, train_iters=4,
                                 checkpoint_factor=2, eval_interval=1000, log_interval=2))
    assert proc.returncode == 0, explain(proc)
    assert (run / "ckpt" / "latest").read_text().strip() == "global_step4"
    return run / "ckpt"


def reshard(small_data, tmp_path, load, save, *extra, in_process=True):
    argv = ("configs/tiny.yml", *tiny_overrides(*small_data, tmp_path, num_gpus=1, load=load,
                                                save=save), *extra)
    if in_process:
        return launch_in_process("tools/ckpts/reshard.py", *argv)
    return deepy("tools/ckpts/reshard.py", *argv)


def errors(proc) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line[:40]]


def test_a_damaged_latest_is_refused_not_replaced_by_an_older_checkpoint(small_data, tmp_path,
                                                                          two_checkpoints):
    load = tmp_path / "ckpt"
    shutil.copytree(two_checkpoints, load)
    damaged = sorted((load / "global_step4").glob("layer_02-model_00-model_states.pt"))[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    out = tmp_path / "resharded"
    proc = reshard(small_data, tmp_path, load, out)
    assert proc.returncode == 1, explain(proc)
    text = proc.stdout + proc.stderr
    assert f"no checkpoint in {load} can be loaded:\n  global_step4:\n    - {damaged}: 100 " \
           "bytes but the manifest recorded" in text, explain(proc)
    assert "Restore the files from a backup, or reshard another checkpoint with iteration=<N>" \
        in text and "start from scratch" not in text and "instead" not in text, explain(proc)
    assert not out.exists()  # the save directory it created is gone with the failure
    # the advice works: the older one, asked for by its iteration
    proc = reshard(small_data, tmp_path, load, out, "iteration=2")
    assert proc.returncode == 0, explain(proc)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["global_step2"]


def add_undeclared_state(step_dir: Path, key: str) -> str:
    """`key` added to the saved optimizer state of one parameter in the real files, which are
    rewritten and recorded in the manifest as a save does (so the checkpoint still verifies);
    the parameter's canonical name."""
    from megatron.checkpointing.durable import write_torch
    from megatron.checkpointing.manifest import FileEntry, read_manifest, write_manifest

    index = json.loads((step_dir / "shards" / "rank_0.json").read_text())
    assert index["optimizer"] == "torch"  # fp32, ZeRO 0: Adam's state is in the model file
    name = index["groups"][0][0][0]  # the first parameter of the first group
    path = step_dir / index["model_file"]
    saved = torch.load(path, weights_only=False)  # not memory-mapped: the file is rewritten
    state = saved["optimizer"]["state"][saved["optimizer"]["param_groups"][0]["params"][0]]
    state[key] = torch.ones_like(state["exp_avg"])
    record = write_torch(saved, path)
    manifest = read_manifest(step_dir)
    entry = manifest.files[index["model_file"]]
    files = {**manifest.files, index["model_file"]: FileEntry(record.size, record.sha256,
                                                              entry.rank)}
    write_manifest(step_dir, dataclasses.replace(manifest, files=files))
    return name


def test_optimizer_state_the_optimizer_did_not_declare_is_refused_by_name_not_dropped(
        trained, tmp_path):
    """docs/checkpoints.md: resharding keeps the optimizer's per-parameter state; state the
    optimizer did not declare (here AMSGrad's max_exp_avg_sq beside Adam's moments) is
    refused, never dropped, and nothing is written."""
    load = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], load)
    step_dir = load / (load / "latest").read_text().strip()
    name = add_undeclared_state(step_dir, "max_exp_avg_sq")
    before = sorted((p.relative_to(load), p.stat().st_mtime_ns) for p in load.rglob("*"))
    out = tmp_path / "tiny_tp2"
    proc = launch_in_process("tools/ckpts/reshard.py", "configs/tiny.yml", *tiny_overrides(
        trained["data"], trained["tokenizer"], tmp_path, num_gpus=2, model_parallel_size=2,
        load=load, save=out))
    assert proc.returncode == 1, explain(proc)
    refusal = (f"{step_dir / 'mp_rank_00_model_states.pt'} ({name}): the optimizer state holds "
               "max_exp_avg_sq, which the optimizer that saved it does not declare (declared: "
               "exp_avg, exp_avg_sq); resharding would lose it. Load at the saving layout, or "
               "declare it in the optimizer registry")
    assert [line.split("): ", 1)[1] for line in errors(proc)] == [refusal] * 2, explain(proc)
    assert not out.exists()  # nothing written, the save directory it created is gone
    assert sorted((p.relative_to(load), p.stat().st_mtime_ns) for p in load.rglob("*")) == before


def test_an_existing_checkpoint_in_save_and_a_checkpoint_as_load_are_refused_before_any_worker(
        small_data, tmp_path, two_checkpoints):
    out = tmp_path / "out"
    (out / "global_step4").mkdir(parents=True)
    (out / "global_step4" / "mine.txt").write_text("kept")
    proc = reshard(small_data, tmp_path, two_checkpoints, out, in_process=False)
    assert proc.returncode == 1
    assert errors(proc) == [
        f"error: {out / 'global_step4'} already exists: resharding never overwrites a "
        "checkpoint; choose another 'save' directory, or remove that one"], explain(proc)
    assert (out / "global_step4" / "mine.txt").read_text() == "kept"
    assert "worker(s)" not in proc.stderr
    proc = reshard(small_data, tmp_path, two_checkpoints / "global_step2", tmp_path / "o2",
                   in_process=False)
    assert proc.returncode == 1
    assert errors(proc) == [
        f"error: load={two_checkpoints / 'global_step2'} is one checkpoint; set load to the "
        f"directory that holds it ({two_checkpoints}) and iteration=2"], explain(proc)


def test_deepy_prints_a_script_s_own_help():
    proc = deepy("tools/ckpts/reshard.py", "--help")
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.startswith("Rewrite a checkpoint at another parallel layout")
    # the example keeps its line break (the docstring is raw)
    assert "configs/tiny.yml \\\n        load=checkpoints/tiny save=" in proc.stdout
    assert proc.stdout.endswith("usage: python deepy.py tools/ckpts/reshard.py configs/a.yml "
                                "[configs/b.yml] [key=value ...]\nEvery config key, with its "
                                f"default and meaning: configs/README.md\n")
    assert deepy("train.py", "configs/tiny.yml", "-h").stdout.startswith(
        (ROOT / "train.py").read_text().split('"""')[1].splitlines()[0])


@pytest.mark.parametrize("finetune", [True, False])
def test_training_refuses_one_checkpoint_as_load_before_any_worker(two_checkpoints, small_data,
                                                                   tmp_path, finetune):
    """A run's last line names its global_step<N> directory; given as `load`, it read as a
    directory holding no checkpoint, and a fine-tune started from random weights."""
    from megatron.neox_arguments import NeoXArgs
    from megatron.preflight import preflight

    step = two_checkpoints / "global_step2"
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], tiny_overrides(
        *small_data, tmp_path, load=step, save=tmp_path / "out", finetune=str(finetune).lower(),
        num_gpus=1))
    with pytest.raises(ValueError, match=rf"^load={step} is one checkpoint; set load to the "
                       rf"directory that holds it \({two_checkpoints}\) and iteration=2$"):
        preflight(args, "train.py")
