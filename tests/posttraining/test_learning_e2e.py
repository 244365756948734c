"""Post-training that means something: on a synthetic chat task a tiny model can learn (name the
thing of a colour; prefer one style of answer), `deepy.py train.py` with each objective makes
the model do what the data asks, measured on held-out data.

- SFT (several conversations a sample, attention and positions restarting at each): greedy
  answers right for most colours after 60 steps, none after 1 (loss only on the assistant
  turns: `supervised_tokens` counts them).
- DPO from the SFT model (at configs/post-training/tiny_dpo.yml's learning rate): its first
  step's loss is log 2 (policy = reference), on held-out pairs the chosen style's reward margin
  grows and nearly every pair is ranked right, and the model still answers right.
- KTO: desirable answers end above undesirable ones (rewards relative to the reference).
- RM: a reward model fine-tuned from the SFT model ranks held-out pairs right, and exported to
  Hugging Face it gives the same values.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.checkpointing.layout import manifest_digest
from megatron.data.chat_example import question
from tests.posttraining.runs import greedy_accuracy, posttrain
from tests.runs import ROOT, deepy, explain

pytestmark = pytest.mark.slow


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]


def training(run: Path) -> list[dict]:
    return [r for r in records(run) if "lm_loss" in r]


def evaluation(run: Path, split: str = "validation") -> list[dict]:
    """The records of the split's evaluations: their metrics under `<split>/<name>`."""
    return [r for r in records(run) if any(k.startswith(f"{split}/") for k in r)]


def test_sft_trains_only_the_assistant_turns_and_learns_the_answers(chat_files, sft_run):
    before = greedy_accuracy(sft_run / "ckpt" / "global_step1", chat_files)
    after = greedy_accuracy(sft_run / "ckpt" / "global_step60", chat_files)
    assert before <= 0.25 and after >= 0.75, (before, after)
    steps = training(sft_run)
    # a step reads 16 samples of 64 positions, a few conversations each; only the answers
    # (about 8 tokens a conversation) carry loss, not the prompts or the padding
    assert all(80 <= r["supervised_tokens"] <= 0.5 * 16 * 64 for r in steps), steps
    assert steps[-1]["lm_loss"] < 0.5 * steps[0]["lm_loss"]


def test_dpo_from_the_sft_model_prefers_the_chosen_style_on_held_out_pairs(chat_files, sft_run,
                                                                          tmp_path):
    run = tmp_path / "dpo"
    proc = posttrain(chat_files, run, "dpo", load=sft_run / "ckpt", finetune=True,
                     train_iters=30, eval_interval=15, log_interval=1, dpo_beta=0.1,
                     **{"optimizer.params.lr": 1e-4, "min_lr": 1e-5})
    steps = training(run)
    assert math.isclose(steps[0]["lm_loss"], math.log(2), rel_tol=1e-5)  # policy = reference
    valid = evaluation(run)
    assert valid[-1]["validation/margins"] > valid[0]["validation/margins"] > 0
    assert valid[-1]["validation/reward_acc"] >= 0.9
    test = evaluation(run, "test")[-1]
    assert test["test/reward_acc"] >= 0.9 and test["test/pairs"] == 16
    assert " | dpo_loss " in proc.stdout and " | margins " in proc.stdout
    # the margins grew by keeping the chosen answers, not by unlearning both
    assert greedy_accuracy(run / "ckpt" / "global_step30", chat_files) >= 0.75
    manifest = json.loads((run / "ckpt" / "global_step30" / "manifest.json").read_text())
    start = (sft_run / "ckpt" / "global_step60").absolute()
    assert manifest["client_state"]["reference"] == {
        "path": str(start), "iteration": 60, "manifest_sha256": manifest_digest(start)}


def test_resuming_dpo_whose_reference_checkpoint_moved_needs_reference_load(chat_files,
                                                                           sft_run, tmp_path):
    """The reference model is the checkpoint training started from, reloaded on every resume:
    without it the run would compare the policy with something else, so it stops, naming the
    path; once moved, reference_load says where it is now (docs/posttraining.md)."""
    reference = tmp_path / "sft"
    reference.mkdir()
    shutil.copytree(sft_run / "ckpt" / "global_step60", reference / "global_step60")
    (reference / "latest").write_text("global_step60")
    run = tmp_path / "dpo"
    posttrain(chat_files, run, "dpo", load=reference, finetune=True, train_iters=2,
              eval_interval=2, checkpoint_factor=1)
    moved = tmp_path / "moved"
    shutil.move(str(reference), moved)
    proc = posttrain(chat_files, run, "dpo", check=False, train_iters=2, eval_interval=2,
                     checkpoint_factor=1, iteration=1)
    assert proc.returncode == 1, explain(proc)
    gone = (reference / "global_step60").absolute()
    assert f"error: the reference model of this run, {gone}, is gone (DPO and KTO compare the " \
           "policy with the checkpoint training started from): restore it at that path, or set " \
           "reference_load to where it is now" in proc.stderr
    assert "error (rank" not in proc.stderr  # refused by deepy.py, before any worker starts
    proc = posttrain(chat_files, run, "dpo", check=False, train_iters=2, eval_interval=2,
                     checkpoint_factor=1, iteration=1, reference_load=tmp_path)
    assert proc.returncode == 1 and "error (rank" not in proc.stderr, explain(proc)
    assert f"error: reference_load({tmp_path}): {tmp_path / 'global_step60'} is not a directory;" \
           f" it should hold the reference checkpoint this run recorded, {gone} (iteration 60)" \
           in proc.stderr
    proc = posttrain(chat_files, run, "dpo", train_iters=3, eval_interval=3,
                     checkpoint_factor=1, override_lr_scheduler=True, reference_load=moved)
    now = (moved / "global_step60").absolute()
    assert f"reference model moved: recorded {gone}, read from {now}" in proc.stderr
    assert "iteration      3/" in proc.stdout
    manifest = json.loads((run / "ckpt" / "global_step3" / "manifest.json").read_text())
    assert manifest["client_state"]["reference"] == {
        "path": str(now), "iteration": 60, "manifest_sha256": manifest_digest(now)}


def test_kto_raises_desirable_answers_above_undesirable_ones(chat_files, sft_run, tmp_path):
    run = tmp_path / "kto"
    posttrain(chat_files, run, "kto", load=sft_run / "ckpt", finetune=True, train_iters=30,
              eval_interval=30, kto_beta=0.1)
    valid = evaluation(run)[-1]
    assert valid["validation/chosen_rewards"] > valid["validation/rejected_rewards"] + 0.2
    assert valid["validation/desirable"] > 0 and valid["validation/undesirable"] > 0


def test_a_reward_model_ranks_held_out_pairs_and_exports_to_hugging_face(chat_files, sft_run,
                                                                          tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    from megatron.checkpointing.reader import read_checkpoint
    from megatron.model.config import model_config_from_args
    from megatron.model.gpt import GPTModel
    from megatron.model.partition import Sharding
    from megatron.mpu.groups import NO_TP

    run = tmp_path / "rm"
    proc = posttrain(chat_files, run, "rm", load=sft_run / "ckpt", finetune=True,
                     train_iters=30, eval_interval=30)
    assert "the value head starts fresh" in proc.stderr
    test = evaluation(run, "test")[-1]
    assert test["test/accuracy"] >= 0.9 and test["test/margin"] > 1.0
    out = tmp_path / "rm_hf"
    export = subprocess.run([sys.executable, str(ROOT / "tools/ckpts/convert_neox_to_hf.py"),
                             "--input_dir", str(run / "ckpt"), "--output_dir", str(out)],
                            cwd=ROOT, capture_output=True, text=True)
    assert export.returncode == 0, explain(export)
    assert "wrote GPTNeoXForSequenceClassification" in export.stderr
    hf = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    ck = read_checkpoint(str(run / "ckpt"))
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    ours = GPTModel(config).eval()
    ours.load_state_dict(Sharding.for_model(config).shard_model(ck.canonical, NO_TP))
    ids = torch.randint(5, 1500, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mine = ours(ids, torch.arange(9).expand(2, 9))[:, -1]  # the value at the last token
        theirs = hf(ids).logits.squeeze(-1)  # HF reads the last token that is not padding
    assert torch.allclose(mine, theirs, atol=1e-5), (mine, theirs)
    # the exported tokenizer renders conversations as the one the data was made with
    from transformers import AutoTokenizer

    conversation = [question("red"), {"role": "assistant", "content": "cherry!"}]
    assert (AutoTokenizer.from_pretrained(str(out)).apply_chat_template(conversation)
            == AutoTokenizer.from_pretrained(str(chat_files.tokenizer_dir))
            .apply_chat_template(conversation))
    exports_a_tokenizer_that_pads_with_its_end_of_text(chat_files, run / "ckpt", ours, tmp_path)
    refuses_a_reward_model(chat_files, run / "ckpt", tmp_path)


def exports_a_tokenizer_that_pads_with_its_end_of_text(chat_files, ckpt: Path, ours, tmp_path):
    """The same reward model with a tokenizer whose pad is its end-of-text token (GPT-2's, or
    a tokenizer.json without <|padding|>): the export gives it a padding token of its own, so
    Hugging Face reads each text of a padded batch at its end-of-text token, where the model
    was trained to be read; naming the end-of-text id as the pad is refused."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    no_pad = tmp_path / "no_pad"
    no_pad.mkdir()
    text = Path(chat_files.vocab_file).read_text(encoding="utf-8")
    (no_pad / "tokenizer.json").write_text(text.replace("<|padding|>", "<|unused|>"),
                                           encoding="utf-8")
    (no_pad / "tokenizer.yml").write_text(f"vocab_file: {no_pad / 'tokenizer.json'}\n")
    step_dir = ckpt / (ckpt / "latest").read_text()
    configs = [str(step_dir / "config.yml"), str(no_pad / "tokenizer.yml")]

    def export(out: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "tools/ckpts/convert_neox_to_hf.py"),
                               "--input_dir", str(ckpt), "--output_dir", str(out),
                               "--config_file", *configs, *extra],
                              cwd=ROOT, capture_output=True, text=True)

    refused = export(tmp_path / "refused", "--pad_token_id", "0")
    assert refused.returncode == 1 and "error: --pad_token_id 0 is the end-of-text id of the " \
        "tokenizer (HFTokenizer, " in refused.stderr, explain(refused)
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "rm_hf_no_pad"
    proc = export(out)
    assert proc.returncode == 0, explain(proc)
    hf = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    pad = Tokenizer.from_str(text).get_vocab_size(with_added_tokens=True)  # the first id past
    assert (tok.pad_token, tok.pad_token_id, hf.config.pad_token_id) == ("<|padding|>", pad, pad)
    assert f"a padding token of its own, <|padding|> (id {pad})" in proc.stderr
    assert tok.eos_token_id == 0 and tok.decode([5, 0]).endswith("<|endoftext|>")
    rows = [[7, 300, 41, 9, 1200, 0], [88, 5, 0]]  # texts ending in end-of-text, right-padded
    batch = tok.pad({"input_ids": rows}, return_tensors="pt")
    with torch.no_grad():
        theirs = hf(**batch).logits.squeeze(-1)
        mine = torch.stack([ours(torch.tensor([r]), torch.arange(len(r))[None])[0, -1]
                            for r in rows])
    assert batch["input_ids"][1].tolist() == [88, 5, 0, pad, pad, pad]
    assert torch.allclose(mine, theirs, atol=1e-5), (mine, theirs)


def refuses_a_reward_model(chat_files, ckpt: Path, tmp_path: Path) -> None:
    """generate.py, eval.py and DPO on a reward model's checkpoint: one error line from
    deepy.py, naming the checkpoint, before any worker starts."""
    step_dir = ckpt / (ckpt / "latest").read_text()
    common = [f"load={ckpt}", f"vocab_file={chat_files.vocab_file}", "tokenizer_type=HFTokenizer",
              "save=null", "seq_length=64", "max_position_embeddings=64", "num_gpus=1"]
    needs = {"generate.py": "generation", "eval.py": "evaluation"}
    runs = {script: deepy(script, "configs/tiny.yml", *extra, *common)
            for script, extra in (
                ("generate.py", ["configs/text_generation.yml", "maximum_tokens=16",
                                 f"sample_output_file={tmp_path / 'samples.jsonl'}"]),
                ("eval.py", ["eval_tasks=[lambada_openai]"]))}
    for script, proc in runs.items():
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
        assert proc.returncode == 1 and errors == [
            f"error: checkpoint {step_dir} is a reward model (train_impl rm: a value head in "
            f"place of the LM head); {needs[script]} needs a language model: load the checkpoint "
            "the reward model was trained from, or a policy checkpoint"], explain(proc)
        assert "launching" not in proc.stderr + proc.stdout
    dpo = posttrain(chat_files, tmp_path / "dpo", "dpo", check=False, load=ckpt, finetune=True)
    assert dpo.returncode == 1 and f"checkpoint {step_dir} is a reward model" in dpo.stderr, \
        explain(dpo)
    assert "launching" not in dpo.stderr + dpo.stdout
