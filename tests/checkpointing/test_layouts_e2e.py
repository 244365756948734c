"""Real runs at tensor x pipeline parallelism 2 x 2 (four gloo processes, `python deepy.py
train.py configs/tiny.yml`): stopping and resuming is bitwise identical to an uninterrupted run,
and the checkpoint resumes at tensor x pipeline 1 x 1 (two data-parallel processes), resharded
on load, continuing the same loss curve. Dropout is off so that the resharded run (whose
random generators restart from the seed) computes the same function.
"""

from __future__ import annotations

import pytest

from tests.checkpointing.test_resume_e2e import (EXACT_HINT, assert_same_state,
                                                 copy_checkpoints, losses_by_iteration, run)
from tests.runs import explain

TP2_PP2 = dict(num_gpus=4, model_parallel_size=2, pipe_parallel_size=2, hidden_dropout=0.0)
RESHARD_RTOL = 1e-4  # fp32; other tensor-parallel splits sum in another order


@pytest.fixture(scope="module")
def reference(small_data, tmp_path_factory):
    """The uninterrupted tp2 x pp2 run: (losses by iteration, checkpoint root)."""
    run_dir = tmp_path_factory.mktemp("reference-tp2pp2")
    proc = run(small_data, run_dir, **TP2_PP2)
    assert proc.returncode == 0, explain(proc)
    return losses_by_iteration(run_dir), run_dir / "ckpt"


def test_tp2_pp2_stop_and_resume_is_bitwise_identical(small_data, tmp_path, reference):
    want_losses, want_root = reference
    first = run(small_data, tmp_path, exit_interval=3, **TP2_PP2)
    assert first.returncode == 0, explain(first)
    second = run(small_data, tmp_path, **TP2_PP2)
    assert second.returncode == 0, explain(second)
    assert "from iteration 3 to 6" in second.stdout
    assert losses_by_iteration(tmp_path) == want_losses, EXACT_HINT
    assert_same_state(tmp_path / "ckpt" / "global_step6", want_root / "global_step6")


def test_a_tp2_pp2_checkpoint_resumes_at_tp1_pp1(small_data, tmp_path, reference):
    want_losses, want_root = reference
    copy_checkpoints(want_root, tmp_path)
    proc = run(small_data, tmp_path, iteration=4, num_gpus=2, model_parallel_size=1,
               pipe_parallel_size=1, hidden_dropout=0.0)
    assert proc.returncode == 0, explain(proc)
    text = proc.stdout + proc.stderr
    assert "resharded" in text and "model_parallel_size (tp): checkpoint 2, this run 1" in text
    assert "weights, optimizer state loaded" in text
    got = losses_by_iteration(tmp_path)
    assert sorted(got) == [5, 6]
    assert [got[i] for i in (5, 6)] == pytest.approx([want_losses[i] for i in (5, 6)],
                                                     rel=RESHARD_RTOL)
