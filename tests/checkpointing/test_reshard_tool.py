"""tools/ckpts/reshard.py rewrites the checkpoint it is asked for, or nothing: the one `latest`
names (or `iteration=<N>`), never an older one in place of a damaged one; never over an existing
checkpoint; and a failed run leaves no `save` directory behind."""

from __future__ import annotations

import shutil

import pytest

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
