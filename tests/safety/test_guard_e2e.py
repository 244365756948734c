"""The guard in real runs (`python deepy.py train.py configs/tiny.yml`): a good run saves
iterations 5 and 10; resumed at a learning rate of 1e8, every step after the first overflows
(the first one's gradients come from the good weights). At a learning rate of 1000 the weights
grow for some steps first, and where the loss or only the gradients turn inf or NaN, and at
which step, depends on the kernels (torch SDPA's attention overflowed before ours).
What a user relies on: the run stops with a non-zero status naming the iteration and why, no
checkpoint is written from the diverged state, `latest` and retention keep the good one, and a
rollback returns to it and skips the batches since."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.runs import deepy, explain, tiny_overrides


@pytest.fixture(scope="module")
def good_run(small_data, tmp_path_factory):
    """configs/tiny.yml, one process, 10 iterations, checkpoints at 5 and 10."""
    run = tmp_path_factory.mktemp("guard_good")
    overrides = tiny_overrides(*small_data, run, num_gpus=1, train_iters=10, checkpoint_factor=5,
                               eval_interval=1000, log_interval=1)
    proc = deepy("train.py", "configs/tiny.yml", *overrides)
    assert proc.returncode == 0, explain(proc)
    return run


# why a step is bad: the loss, or only the gradients, not finite
BAD = r"the (?:loss is (?:nan|inf|-inf)|gradients hold inf or NaN)"


def diverging(small_data, good_run, tmp_path, **extra):
    """Copy of the good run, resumed to 30 iterations at lr 1e8 (schedule overridden)."""
    run = tmp_path / "run"
    shutil.copytree(good_run / "ckpt", run / "ckpt")
    overrides = tiny_overrides(*small_data, run, num_gpus=1, train_iters=30, checkpoint_factor=5,
                               eval_interval=1000, log_interval=1, keep_last_n_checkpoints=1,
                               override_lr_scheduler="true", min_lr=0,
                               **{"optimizer.params.lr": 1e8, **extra})
    return run, deepy("train.py", "configs/tiny.yml", *overrides)


def manifest(step_dir):
    return json.loads((step_dir / "manifest.json").read_text())


def test_skip_stops_after_max_bad_steps_and_keeps_the_good_checkpoint(small_data, good_run,
                                                                     tmp_path):
    run, proc = diverging(small_data, good_run, tmp_path, max_bad_steps=4)
    assert proc.returncode == 3, explain(proc)
    out = proc.stdout + proc.stderr
    assert re.search(BAD + "; the update was not applied", out), explain(proc)
    assert re.search("training stopped: iteration 15: " + BAD + r"; 4 bad steps in a row since "
                     r"iteration 12 \(max_bad_steps 4\)", out), explain(proc)
    assert f"the newest good checkpoint is {run / 'ckpt'}/global_step10" in out
    assert "not saving a checkpoint at iteration 15" not in out  # stopped before that save
    ckpt = run / "ckpt"
    assert (ckpt / "latest").read_text() == "global_step10"
    # nothing was written from the diverged state (retention runs only after a save)
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step10", "global_step5", "latest"]
    assert manifest(ckpt / "global_step10")["client_state"]["last_loss"] < 10


def test_rollback_returns_to_the_good_checkpoint_and_skips_the_batches_since(small_data,
                                                                           good_run, tmp_path):
    run, proc = diverging(small_data, good_run, tmp_path, bad_step_policy="rollback",
                          max_rollbacks=2)
    assert proc.returncode == 3, explain(proc)
    out = proc.stdout + proc.stderr
    rolled = f"rolled back to {run / 'ckpt'}/global_step10, skipping the"
    assert out.count(rolled) == 2, explain(proc)
    assert re.search("training stopped: iteration 12: " + BAD + r"; 2 rollbacks "
                     r"\(max_rollbacks\) did not get past it", out), explain(proc)
    assert (run / "ckpt" / "latest").read_text() == "global_step10"
