"""tools/ckpts/convert_neox_to_hf.py refusals and options: an --output_dir in a training
directory or holding an earlier export (--overwrite), --iteration, a tokenizer path of the
checkpoint's saved config that is relative to another directory, --architecture mamba_ssm on a
transformer, and its --help.

What a user relies on: each refusal is one line naming the path or option and what to do, comes
before any weight is read (the tests make reading one fail) and writes nothing; --overwrite
leaves no file of the earlier export that transformers would load beside the new one.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from megatron.checkpointing import hf_export
from megatron.checkpointing.weights_only import write_weights_checkpoint
from megatron.model.config import model_config_from_args
from megatron.neox_arguments import NeoXArgs, padded_vocab_size
from megatron.tokenizer import build_tokenizer
from tests.runs import ROOT
from tests.text_generation.models import random_weights
from tests.tools.test_hf_conversion import tool


def tiny_args(tokenizer: str, *overrides: str) -> NeoXArgs:
    return NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], [f"vocab_file={tokenizer}", *overrides])


def tiny_weights(args: NeoXArgs) -> dict[str, torch.Tensor]:
    vocab = build_tokenizer("HFTokenizer", str(args.tokenizer.vocab_file)).vocab_size
    padded = padded_vocab_size(vocab, args.model.make_vocab_size_divisible_by, 1)
    return random_weights(model_config_from_args(args, padded))


@pytest.fixture(scope="module")
def saves(trained, tmp_path_factory):
    """A save directory of configs/tiny.yml holding iterations 1 and 2 (`latest`) of different
    weights: (save dir, {iteration: canonical weights})."""
    args = tiny_args(trained["tokenizer"])
    first = tiny_weights(args)
    weights = {1: first, 2: {k: v + 1 for k, v in first.items()}}
    root = tmp_path_factory.mktemp("export_checks") / "ckpt"
    for iteration, canonical in weights.items():
        write_weights_checkpoint(root, iteration, canonical, args, tp=1)
    return root, weights


@pytest.fixture
def no_weights_read(monkeypatch):
    """Reading the checkpoint's weights fails the test: a refusal must come before it."""
    def read_step(step_dir, args):
        raise AssertionError(f"the weights of {step_dir} were read")

    monkeypatch.setattr(hf_export, "read_step", read_step)


def export(*options: str) -> int:
    return tool("convert_neox_to_hf").main(list(options))


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and modification time."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def last_error(capsys) -> str:
    return capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("where", ["save", "step", "inside_step", "named_like_a_step"])
def test_an_output_dir_in_the_training_directories_is_refused_and_nothing_written(
        where, trained, no_weights_read, capsys):
    save = trained["ckpt"].resolve()
    step = save / "global_step30"
    out = {"save": save, "step": step, "inside_step": step / "hf",
           "named_like_a_step": save / "global_step99"}[where]
    reason = {"save": f"is the save directory {save} (it holds 'latest' or global_step<N> "
                      "checkpoints)",
              "step": f"is the checkpoint directory {step}",
              "inside_step": f"is inside the checkpoint directory {step}",
              "named_like_a_step": f"is named like a checkpoint of the save directory {save} "
                                   "(training would read it)"}[where]
    before = tree(save)
    assert export("--input_dir", str(save), "--output_dir", str(out), "--overwrite") == 1
    assert last_error(capsys) == (
        f"error: --output_dir {out} {reason}: Hugging Face files must not be mixed with training "
        f"files; choose a directory outside it (the default is {save}/hf/global_step30)")
    assert tree(save) == before


def test_a_non_empty_output_dir_needs_overwrite_which_removes_the_earlier_export(
        saves, tmp_path, capsys, caplog, monkeypatch):
    from transformers import AutoModelForCausalLM

    save, weights = saves
    out = tmp_path / "hf"
    out.mkdir()
    # a transformers save's tokenizer files too: AutoTokenizer would read them beside ours
    stale = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "model.safetensors.index.json", "pytorch_model.bin", "special_tokens_map.json",
             "tokenizer.json", "vocab.json", "merges.txt"]
    for name in stale + ["README.md"]:
        (out / name).write_text("{}")
    before = tree(out)
    with monkeypatch.context() as m:
        m.setattr(hf_export, "read_step", lambda *a: pytest.fail("weights read"))
        assert export("--input_dir", str(save), "--output_dir", str(out)) == 1
    assert last_error(capsys) == (
        f"error: --output_dir {out} exists and is not empty: pass --overwrite to export into it "
        "(the model, weight and tokenizer files of an earlier export there are removed first), or "
        "choose a new directory")
    assert tree(out) == before

    caplog.set_level("INFO", logger="megatron")
    assert export("--input_dir", str(save), "--output_dir", str(out), "--overwrite") == 0
    assert (f"--overwrite: removed 8 file(s) of an earlier export from {out}: "
            f"{', '.join(sorted(stale))}") in caplog.messages
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    model = AutoModelForCausalLM.from_pretrained(out)  # a stale index would point at stale shards
    assert torch.equal(model.get_input_embeddings().weight,
                       weights[2]["0.word_embeddings.weight"])


def test_iteration_exports_that_checkpoint_of_the_save_directory(saves, tmp_path, caplog):
    from safetensors.torch import load_file

    save, weights = saves
    caplog.set_level("INFO", logger="megatron")
    assert export("--input_dir", str(save), "--iteration", "1", "--output_dir",
                  str(tmp_path / "hf")) == 0
    assert f"from {save}/global_step1 to {tmp_path / 'hf'}" in caplog.text
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    assert torch.equal(tensors["gpt_neox.embed_in.weight"], weights[1]["0.word_embeddings.weight"])


def test_iteration_disagreeing_with_a_global_step_input_dir_is_refused(saves, tmp_path,
                                                                       no_weights_read, capsys):
    save, _ = saves
    assert export("--input_dir", str(save / "global_step2"), "--iteration", "1",
                  "--output_dir", str(tmp_path / "hf")) == 1
    assert last_error(capsys) == (
        f"error: --iteration 1 disagrees with --input_dir {save}/global_step2 (iteration 2), "
        f"which is one checkpoint: give the save directory {save} with --iteration 1, or "
        f"{save}/global_step2 without --iteration")
    assert export("--input_dir", str(save), "--iteration", "7", "--output_dir",
                  str(tmp_path / "hf")) == 1
    assert f"{save}/global_step7 (iteration=7) does not exist" in last_error(capsys)
    assert not (tmp_path / "hf").exists()


def test_a_relative_tokenizer_path_of_the_saved_config_is_explained(saves, trained, tmp_path,
                                                                    monkeypatch, capsys):
    """The saved config.yml keeps vocab_file as training got it, relative to where it ran."""
    run = tmp_path / "run"
    (run / "tok").mkdir(parents=True)
    shutil.copy(trained["tokenizer"], run / "tok" / "tokenizer.json")
    step = write_weights_checkpoint(run / "ckpt", 3, saves[1][1], tiny_args("tok/tokenizer.json"),
                                    tp=1)
    monkeypatch.chdir(tmp_path)
    options = ["--input_dir", str(run / "ckpt"), "--output_dir", str(tmp_path / "hf")]
    assert export(*options) == 1
    assert last_error(capsys) == (
        f"error: HFTokenizer: vocab_file tok/tokenizer.json does not exist; it comes from the "
        f"checkpoint's saved config ({step}/config.yml); a relative path is read from the "
        f"current directory, {Path.cwd()}: run the export from the directory training ran in, "
        "or pass --config_file with a config giving the right vocab_file (e.g. --config_file "
        f"{step}/config.yml plus a YAML file setting vocab_file)")
    assert not (tmp_path / "hf").exists()
    monkeypatch.chdir(run)  # what the message advises
    assert export(*options) == 0
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_mamba_ssm_on_a_transformer_says_it_is_not_a_mamba_model(saves, tmp_path,
                                                                no_weights_read, capsys):
    save, _ = saves
    assert export("--input_dir", str(save), "--output_dir", str(tmp_path / "out"),
                  "--architecture", "mamba_ssm") == 1
    assert last_error(capsys) == (
        "error: --architecture mamba_ssm: the checkpoint is not a Mamba model (it has attention "
        "layers); mamba_ssm export is for Mamba models: leave --architecture out (auto) to "
        "export this one")
    assert not (tmp_path / "out").exists()
    config = model_config_from_args(NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"]), 2048)
    mixed = dataclasses.replace(config, attention_types=("mamba", "global", "mamba", "global"))
    with pytest.raises(ValueError) as e:
        hf_export.check_mamba(mixed, "mamba_ssm")
    assert str(e.value) == (
        "--architecture mamba_ssm: the checkpoint is not a Mamba model (it has attention "
        "layers: 1, 3 of its 4); mamba_ssm export is for Mamba models, of Mamba layers only (a "
        "model mixing Mamba and attention layers has no Hugging Face form)")


def test_help_describes_the_tool_in_full(capsys):
    with pytest.raises(SystemExit) as e:
        export("--help")
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("or with --architecture mamba_ssm a Mamba model in the mamba_ssm package's format "
            "(config.json and pytorch_model.bin, as GPT-NeoX's convert_neox_to_mamba_ssm.py "
            "writes).") in text
    assert "--input_dir checkpoints/tiny --iteration 100" in text and "--overwrite" in text
    assert "from_pretrained(output_dir)` and AutoTokenizer (a reward" in text
    assert "--pad_token_id PAD_TOKEN_ID, --pad-token-id PAD_TOKEN_ID" in text
