"""Starting and resuming: a fine-tune's command run again after a stop resumes from the
fine-tune's own checkpoint (its checkpoints record the one it started from) and ends where the
fine-tune never stopped would; a save directory holding something else is refused before it is
overwritten; a resume at another seq_length says the data order changes."""

import re

import pytest
import torch

from megatron.checkpointing.fine_tune import FINE_TUNED_FROM
from megatron.checkpointing.layout import manifest_digest
from megatron.checkpointing.manifest import read_manifest
from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT, explain, launch_in_process, read_metrics, tiny_overrides


def fine_tune(trained, run, *extra):
    overrides = tiny_overrides(trained["data"], trained["tokenizer"], run, num_gpus=1,
                               train_iters=4, checkpoint_factor=2, log_interval=1,
                               eval_interval=1000, load=trained["ckpt"], finetune="true")
    return launch_in_process("train.py", "configs/tiny.yml", *overrides, *extra)


def test_a_stopped_fine_tune_run_again_resumes_from_its_own_checkpoint(trained, tmp_path):
    whole = fine_tune(trained, tmp_path / "whole")
    assert whole.returncode == 0, explain(whole)
    stopped = fine_tune(trained, tmp_path / "stopped", "exit_interval=2")
    assert stopped.returncode == 0, explain(stopped)
    source = (trained["ckpt"] / "global_step30").absolute()
    recorded = read_manifest(tmp_path / "stopped/ckpt/global_step2").client_state[FINE_TUNED_FROM]
    assert recorded == {"path": str(source), "iteration": 30,
                        "manifest_sha256": manifest_digest(source)}
    again = fine_tune(trained, tmp_path / "stopped")
    assert again.returncode == 0, explain(again)
    assert (f"fine-tune resumes from its own checkpoint {tmp_path / 'stopped/ckpt/global_step2'}"
            f" (iteration 2); it started from {source}") in again.stderr + again.stdout
    assert "from iteration 2 to 4" in again.stdout
    # the record travels on: the resumed run's checkpoint names the same start
    final = read_manifest(tmp_path / "stopped/ckpt/global_step4").client_state
    assert final[FINE_TUNED_FROM] == recorded
    losses = [{r["iteration"]: r["lm_loss"] for r in read_metrics(tmp_path / run / "logs")[0]}
              for run in ("whole", "stopped")]
    assert set(losses[0]) == {1, 2, 3, 4} and losses[1] == losses[0]
    step = [tmp_path / run / "ckpt/global_step4" for run in ("whole", "stopped")]
    layers = sorted(p.name for p in step[0].glob("layer_*-model_states.pt"))
    assert layers and layers == sorted(p.name for p in step[1].glob("layer_*-model_states.pt"))
    for name in layers:
        a, b = (torch.load(s / name, weights_only=False) for s in step)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_a_fine_tune_into_a_save_directory_of_something_else_is_refused(trained, tmp_path):
    """The save directory holds checkpoints no fine-tune wrote (here a copy of the pretrained
    run): deepy.py refuses before the fine-tune overwrites them."""
    import shutil

    from megatron.preflight import preflight

    shutil.copytree(trained["ckpt"], tmp_path / "other")
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
        "num_gpus=1", "finetune=true", f"save={tmp_path / 'other'}",
        f"log_dir={tmp_path / 'logs'}"])
    expected = (f"save {tmp_path / 'other'} already holds {tmp_path / 'other/global_step30'} "
                "(iteration 30), which records no fine-tune source (not a fine-tune, or one saved "
                "before fine-tunes recorded it): this fine-tune would overwrite it")
    with pytest.raises(ValueError, match=re.escape(expected)):
        preflight(args, "train.py")
    # in place: its checkpoints, numbered from 0 again, would mix with the ones it starts from
    in_place = args.replace(load=str(tmp_path / "other"))
    with pytest.raises(ValueError, match=re.escape(
            f"finetune is true and save is load ({tmp_path / 'other'}): the fine-tune's "
            "checkpoints, numbered from iteration 0 again, would mix with the ones it starts "
            "from")):
        preflight(in_place, "train.py")


def test_a_run_that_would_replace_another_runs_checkpoints_is_refused(trained, tmp_path):
    """A fresh run (load unset, or load mistyped or elsewhere) into a save directory holding
    checkpoints would replace them iteration for iteration and move `latest` back: deepy.py
    refuses it, naming them; with load = save the run goes on from them."""
    import shutil

    from megatron.preflight import preflight

    save = tmp_path / "other"
    shutil.copytree(trained["ckpt"], save)
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
        "num_gpus=1", f"save={save}", f"log_dir={tmp_path / 'logs'}", "train_iters=40",
        "override_lr_scheduler=true"])
    tags = ", ".join(sorted(p.name for p in save.iterdir() if p.name.startswith("global_step")))
    for load, said in ((None, "load is not set"), (tmp_path / "typo", f"load is {tmp_path}/typo"),
                       (trained["ckpt"], f"load is {trained['ckpt']}")):
        with pytest.raises(ValueError) as err:
            preflight(args.replace(load=None if load is None else str(load)), "train.py")
        assert str(err.value) == (
            f"save {save} already holds checkpoints ({tags}; latest global_step30) that this "
            f"run does not go on from ({said}): its checkpoints would replace them and move "
            f"latest. Set load={save} to go on from them, or give save an empty directory")
    preflight(args.replace(load=str(save)), "train.py")  # going on from them
    preflight(args.replace(load=None, save=str(tmp_path / "new")), "train.py")  # empty


def test_resuming_at_another_seq_length_says_the_data_order_changes(trained, tmp_path, caplog):
    """Allowed, as in GPT-NeoX (context extension), with one warning from deepy.py."""
    import logging

    from megatron.preflight import preflight

    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], trained["overrides"] + [
        "num_gpus=1", "seq_length=32", "train_iters=40", "override_lr_scheduler=true",
        f"save={tmp_path / 'out'}", f"log_dir={tmp_path / 'logs'}"])
    with caplog.at_level(logging.WARNING, logger="megatron"):
        preflight(args, "train.py")
    assert (f"seq_length changes from 64 (checkpoint {trained['ckpt'] / 'global_step30'}) to 32:"
            " training goes on from the checkpoint's iteration and sample count, but the samples"
            " are cut anew at 32 tokens") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="megatron"):
        preflight(args.replace(seq_length=64), "train.py")
    assert "seq_length changes" not in caplog.text
