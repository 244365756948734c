"""GPT-2's vocabulary (50257 ids) across parallel layouts: equivalence, resume and reshard.

The embedding and LM head hold the vocabulary padded to a multiple of
make_vocab_size_divisible_by x model_parallel_size, as GPT-NeoX pads: 50304 rows at tp1, 50432
at tp2. The padded rows are never targets, but their logits enter the softmax (as in GPT-NeoX:
nothing masks them), so a tp1 and a tp2 run of the same config train different models. Layout
equivalence is therefore asserted between models of the same padded size: the one-process
reference pads with make_vocab_size_divisible_by 256, which gives the same 50432 rows as tp2
with the default 128; then loss traces and final weights, padded rows included, must match
within tests/e2e/test_equivalence.py's tolerances (its docstring says why those). The 128 rows
one process would leave out raise every loss by about 2.4e-4 relative (measured; their share of
the softmax, log(50432 / 50304) at initialisation), ten times that tolerance.

A checkpoint keeps its padded size wherever it goes: the tp2 checkpoint resharded to tp1 and to
tp4 (12608 rows a rank) holds the same state bit for bit, and training on from it repeats the
tp2 run's losses; tp3 cannot split 50432 rows and is refused before any worker starts.

The tokenizer has GPT-2's id count with the corpus's tokens spread over the whole id range (the
small BPE's ids scaled up, the gaps filled with unused tokens), so that the data's targets fall
in every tensor-parallel rank's slice of the vocabulary, up to the last real id 50256.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from megatron.checkpointing.weights import full_weights
from tests.checkpointing.test_reshard import assert_same_state, full_state
from tests.e2e.test_equivalence import (STEPS, WEIGHT_ATOL, assert_trains_like, initial_weights,
                                       launch, train)
from tests.runs import deepy, explain, launch_in_process, read_metrics, tiny_overrides

GPT2_IDS = 50257
PADDED = 50432  # at tp2 (128 x 2); at tp1 GPT-NeoX pads to 50304
RESUME_FROM = 4
# 12 heads split over 2, 3 and 4 ranks, so that only the vocabulary can refuse a degree
SHAPE = dict(num_layers=2, hidden_size=48, num_attention_heads=12, rotary_pct=0.5,
             seq_length=64, max_position_embeddings=64, extra_save_iters=f"[{RESUME_FROM}]")


def spread_to_gpt2_ids(tokenizer_json: Path, out: Path) -> None:
    """Write `out`: the BPE tokenizer `tokenizer_json` with GPT-2's 50257 ids, its own n ids
    moved to i * 50256 // (n - 1) (the first stays 0, the last becomes 50256) and every other
    id an unused token that no merge produces."""
    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    moved = {i: i * (GPT2_IDS - 1) // (len(vocab) - 1) for i in range(len(vocab))}
    spec["model"]["vocab"] = {token: moved[i] for token, i in vocab.items()}
    for added in spec["added_tokens"]:
        added["id"] = moved[added["id"]]
    taken = set(moved.values())
    spec["model"]["vocab"].update(
        {f"<|unused_{i}|>": i for i in range(GPT2_IDS) if i not in taken})
    out.write_text(json.dumps(spec))


@pytest.fixture(scope="module")
def gpt2_sized(small_data, tmp_path_factory):
    """(data prefix, tokenizer path): the small data's corpus tokenized with 50257 ids."""
    from megatron.data.indexed_dataset import MMapIndexedDataset
    from megatron.data.preprocess import preprocess
    from megatron.tokenizer import build_tokenizer

    prefix, tokenizer = small_data
    out = tmp_path_factory.mktemp("gpt2-sized")
    spread_to_gpt2_ids(Path(tokenizer), out / "tokenizer.json")
    assert build_tokenizer("HFTokenizer", str(out / "tokenizer.json")).vocab_size == GPT2_IDS
    preprocess(str(Path(prefix).parent / "builtin.jsonl"), str(out / "builtin"), "HFTokenizer",
               str(out / "tokenizer.json"), append_eod=True)
    data = MMapIndexedDataset(str(out / "builtin_text_document"))
    ids = np.concatenate([data[i] for i in range(len(data))])
    # targets in each tp4 rank's slice, the last real id among them
    assert np.unique(ids // (PADDED // 4)).tolist() == [0, 1, 2, 3] and ids.max() == GPT2_IDS - 1
    return str(out / "builtin_text_document"), str(out / "tokenizer.json")


def manifest_run(step_dir: Path) -> dict:
    return json.loads((step_dir / "manifest.json").read_text())["run"]


@pytest.fixture(scope="module")
def reference(gpt2_sized, tmp_path_factory):
    """One process, padded to tp2's 50432 rows: (losses, checkpoint root)."""
    run_dir = tmp_path_factory.mktemp("single")
    losses, step_dir = train(gpt2_sized, run_dir, make_vocab_size_divisible_by=256, **SHAPE)
    assert manifest_run(step_dir)["padded_vocab_size"] == PADDED
    return losses, step_dir.parent


@pytest.fixture(scope="module")
def tp2(gpt2_sized, tmp_path_factory):
    """The tp2 run every test below starts from: (losses, checkpoint root with the
    checkpoints of RESUME_FROM and STEPS)."""
    run_dir = tmp_path_factory.mktemp("tp2")
    losses, step_dir = train(gpt2_sized, run_dir, num_gpus=2, model_parallel_size=2, **SHAPE)
    assert manifest_run(step_dir)["padded_vocab_size"] == PADDED
    return losses, step_dir.parent


def final_weights(root: Path) -> dict:
    weights = full_weights(root / f"global_step{STEPS}")
    assert weights["0.word_embeddings.weight"].shape[0] == PADDED
    return weights


def test_tp2_trains_the_one_process_model_of_the_same_padded_size(reference, tp2, gpt2_sized,
                                                                  tmp_path):
    (want, want_root), (got, got_root) = reference, tp2
    want_weights = final_weights(want_root)
    assert_trains_like(got, final_weights(got_root), want, want_weights)
    # the LM head's padded rows (all in tp2's second slice) trained through the softmax alone
    start = initial_weights(gpt2_sized, tmp_path, make_vocab_size_divisible_by=256, **SHAPE)
    padded = (want_weights["4.weight"] - start["4.weight"])[GPT2_IDS:]
    assert padded.abs().max() > 10 * WEIGHT_ATOL


def test_tp2_zero1_over_two_replicas_trains_the_same_model(reference, gpt2_sized, tmp_path):
    """The tp2 embedding slices (25216 rows each, padded rows in the second) flattened into
    ZeRO-1's partitions over two data-parallel replicas."""
    want, want_root = reference
    got, step_dir = train(gpt2_sized, tmp_path, num_gpus=4, model_parallel_size=2,
                          pipe_parallel_size=0, zero_optimization="{stage: 1}", **SHAPE)
    assert_trains_like(got, final_weights(step_dir.parent), want, final_weights(want_root))


def reshard(gpt2_sized, tp2_root: Path, out: Path, tp: int):
    """tools/ckpts/reshard.py: the tp2 run's checkpoint RESUME_FROM rewritten at `tp` in `out`.
    Its config keeps tiny.yml's Adam eps (1e-8, not the runs' 1e-4): the run that loads the
    rewritten checkpoint trains with the eps of its own config."""
    prefix, tok = gpt2_sized
    return launch_in_process("tools/ckpts/reshard.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, out.parent, num_gpus=tp, model_parallel_size=tp, load=tp2_root, save=out,
        iteration=RESUME_FROM, train_iters=STEPS, **SHAPE))


def assert_resharded_and_resumes(gpt2_sized, tp2, tmp_path: Path, tp: int) -> str:
    """Reshard the tp2 checkpoint to `tp` (the same state bit for bit, 50432 rows kept), then
    train on from it at `tp`: the tp2 run's last losses and final weights. Returns the resumed
    run's output."""
    want, tp2_root = tp2
    out = tmp_path / f"tp{tp}"
    proc = reshard(gpt2_sized, tp2_root, out, tp)
    assert proc.returncode == 0, explain(proc)
    said = [line for line in proc.stderr.splitlines() if "resharded " in line]
    assert said and all("[INFO]" in line for line in said), said  # what was asked: no warning
    run = manifest_run(out / f"global_step{RESUME_FROM}")
    assert (run["tp"], run["padded_vocab_size"]) == (tp, PADDED)
    assert_same_state(full_state(tp2_root, f"global_step{RESUME_FROM}"), full_state(out))

    resumed = tmp_path / "resumed"
    proc = launch(gpt2_sized, resumed, num_gpus=tp, model_parallel_size=tp, load=out, **SHAPE)
    assert f"from iteration {RESUME_FROM} to {STEPS}" in proc.stdout, explain(proc)
    got = [r["lm_loss"] for r in read_metrics(resumed / "logs")[0]]
    assert_trains_like(got, final_weights(resumed / "ckpt"), want[RESUME_FROM:],
                       final_weights(tp2_root))
    return proc.stdout


def test_a_tp2_checkpoint_resharded_to_tp1_keeps_its_rows_and_trains_on(gpt2_sized, tp2,
                                                                        tmp_path):
    stdout = assert_resharded_and_resumes(gpt2_sized, tp2, tmp_path, tp=1)
    assert ("padded vocabulary: 50432 rows, as in the checkpoint to load (a new run at "
            "model_parallel_size 1 would pad to 50304)") in stdout


@pytest.mark.slow
def test_a_tp2_checkpoint_resharded_to_tp4_keeps_its_rows_and_trains_on(gpt2_sized, tp2,
                                                                        tmp_path):
    assert_resharded_and_resumes(gpt2_sized, tp2, tmp_path, tp=4)


@pytest.mark.parametrize("script", ["tools/ckpts/reshard.py", "train.py"])
def test_tp3_cannot_split_the_tp2_rows_and_is_refused_before_workers_start(gpt2_sized, tp2,
                                                                           tmp_path, script):
    prefix, tok = gpt2_sized
    step_dir = tp2[1] / f"global_step{STEPS}"
    refused = deepy(script, "configs/tiny.yml", *tiny_overrides(
        prefix, tok, tmp_path, num_gpus=3, model_parallel_size=3, load=tp2[1], **SHAPE))
    assert refused.returncode == 1, explain(refused)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: checkpoint {step_dir} embeds a padded vocabulary of 50432 rows, "
                      "which model_parallel_size 3 cannot split into equal parts; use a "
                      "model_parallel_size that divides 50432 (e.g. the one it was saved "
                      "with)"], explain(refused)
    assert "worker(s):" not in refused.stderr  # decided before any worker was launched
