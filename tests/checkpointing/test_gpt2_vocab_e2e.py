"""GPT-2's vocabulary (50257 ids) is padded to 50432 rows at tensor-parallel degree 2 and to
50304 at 1 (make_vocab_size_divisible_by 128 x tp, as GPT-NeoX pads). A tp2 checkpoint keeps its
50432 rows when it is resumed or resharded at tp1; a degree that cannot split them is refused
before the model is built."""

import json

import pytest
from tokenizers import Tokenizer

from tests.runs import deepy, explain, read_metrics, tiny_overrides

GPT2_IDS = 50257
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpt2_sized(small_data, tmp_path_factory):
    """(data prefix, a tokenizer of the small data's BPE grown to GPT-2's 50257 ids)."""
    prefix, tokenizer = small_data
    tok = Tokenizer.from_file(tokenizer)
    tok.add_tokens([f"<|unused_{i}|>" for i in range(GPT2_IDS - tok.get_vocab_size())])
    assert tok.get_vocab_size() == GPT2_IDS
    path = tmp_path_factory.mktemp("gpt2-sized") / "tokenizer.json"
    tok.save(str(path))
    return prefix, str(path)


def losses(run_dir):
    train, _ = read_metrics(run_dir / "logs")
    return {r["iteration"]: r["lm_loss"] for r in train}


def manifest_run(step_dir):
    return json.loads((step_dir / "manifest.json").read_text())["run"]


def test_a_tp2_checkpoint_resumes_and_reshards_at_tp1(gpt2_sized, tmp_path):
    prefix, tok = gpt2_sized
    common = dict(train_iters=6, log_interval=1, checkpoint_factor=100, eval_interval=100,
                  hidden_dropout=0.0)
    full, part = tmp_path / "full", tmp_path / "part"
    reference = deepy("train.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, full, num_gpus=2, model_parallel_size=2, **common))
    assert reference.returncode == 0, explain(reference)
    stopped = deepy("train.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, part, num_gpus=2, model_parallel_size=2, exit_interval=4, **common))
    assert stopped.returncode == 0, explain(stopped)
    assert manifest_run(part / "ckpt" / "global_step4")["padded_vocab_size"] == 50432

    resumed = deepy("train.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, part, num_gpus=1, model_parallel_size=1, **common))
    assert resumed.returncode == 0, explain(resumed)
    assert ("padded vocabulary: 50432 rows, as in the checkpoint to load (a new run at "
            "model_parallel_size 1 would pad to 50304)") in resumed.stdout, explain(resumed)
    assert "from iteration 4 to 6" in resumed.stdout
    got, want = losses(part), losses(full)
    assert [got[i] for i in (5, 6)] == pytest.approx([want[i] for i in (5, 6)], rel=1e-4)
    assert manifest_run(part / "ckpt" / "global_step6")["padded_vocab_size"] == 50432

    out = tmp_path / "tp1"
    rewritten = deepy("tools/ckpts/reshard.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, tmp_path, num_gpus=1, model_parallel_size=1, load=full / "ckpt",
        save=out, **common))
    assert rewritten.returncode == 0, explain(rewritten)
    run = manifest_run(out / "global_step6")
    assert (run["tp"], run["padded_vocab_size"]) == (1, 50432)


def test_a_degree_that_cannot_split_the_vocabulary_is_refused_before_workers_start(
        gpt2_sized, tmp_path):
    """50304 rows (saved at tp1) split over 2 or 3 ranks, not over 5: deepy.py refuses that
    from the checkpoint's manifest, with no worker started."""
    prefix, tok = gpt2_sized
    run = tmp_path / "run"
    shape = dict(num_attention_heads=10, hidden_size=160, eval_interval=100, train_iters=2)
    saved = deepy("train.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, run, num_gpus=1, checkpoint_factor=2, **shape))
    assert saved.returncode == 0, explain(saved)
    refused = deepy("train.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, run, num_gpus=5, model_parallel_size=5, **shape))
    assert refused.returncode == 1, explain(refused)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: checkpoint {run / 'ckpt' / 'global_step2'} embeds a padded "
                      "vocabulary of 50304 rows, which model_parallel_size 5 cannot split into "
                      "equal parts; use a model_parallel_size that divides 50304 (e.g. the one "
                      "it was saved with)"], explain(refused)
    assert "worker(s):" not in refused.stderr  # decided before any worker was launched
