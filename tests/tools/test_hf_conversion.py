"""tools/ckpts/convert_neox_to_hf.py and convert_hf_to_neox.py: checkpoints <-> Hugging Face
model directories, checked through real transformers models (built from configs, nothing
downloaded).

What a user relies on: the exported directory loads with AutoModelForCausalLM / AutoTokenizer
and gives our logits; an imported HF model gives HF's logits in our model; neox -> HF -> neox
returns the same bits; wrong inputs are refused naming the key, values or path.
Tolerance: fp32 logits within 2e-5 absolute (the two implementations differ only in kernel
choice and summation order; observed <= 1e-6 on logits of magnitude ~2).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.checkpointing.hf_export import write_hf_tokenizer
from megatron.checkpointing.manifest import check_files, read_manifest
from megatron.checkpointing.weights import full_weights
from megatron.checkpointing.weights_only import write_weights_checkpoint
from megatron.model.config import model_config_from_args
from megatron.neox_arguments import NeoXArgs, padded_vocab_size
from megatron.text_generation.inference_model import InferenceModel
from megatron.checkpointing.reader import read_checkpoint
from megatron.tokenizer import build_tokenizer
from tests.runs import ROOT, build_small_dataset, explain, launch_in_process, tiny_overrides
from tests.text_generation.models import random_weights

ATOL = 2e-5
SEQ = 48
TEXTS = ["def main(argv=None):\n    return 0", "héllo wörld <|endoftext|> again", ""]


def tool(name: str):
    """The entry script tools/ckpts/<name>.py as a module (its `main(argv)`)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "ckpts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batch(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def our_logits(config, canonical, tokens) -> torch.Tensor:
    model = InferenceModel.from_canonical(config, canonical)
    with torch.inference_mode():
        return model.forward(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))


def hf_logits(hf_dir: Path, tokens) -> tuple[torch.Tensor, object]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    with torch.inference_mode():
        return model(tokens).logits, model


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(data prefix, tokenizer.json, a YAML pointing the shipped configs at them)."""
    root = tmp_path_factory.mktemp("hf_data")
    prefix, tokenizer = build_small_dataset(root)
    paths = root / "paths.yml"
    paths.write_text(f"vocab_file: {tokenizer}\ndata_path: {prefix}\n")
    return prefix, tokenizer, paths


@pytest.fixture(scope="module")
def pythia_tp2_pp2(data, tmp_path_factory):
    """configs/tiny.yml (Pythia style) trained 2 steps with tensor 2 x pipeline 2."""
    prefix, tokenizer, _ = data
    run = tmp_path_factory.mktemp("pythia_run")
    overrides = tiny_overrides(prefix, tokenizer, run, train_iters=2, checkpoint_factor=2,
                               num_gpus=4, model_parallel_size=2, pipe_parallel_size=2,
                               eval_interval=1000, eval_iters=1, log_interval=1, seq_length=SEQ)
    proc = launch_in_process("train.py", "configs/tiny.yml", *overrides)
    assert proc.returncode == 0, explain(proc)
    return run / "ckpt" / "global_step2"


@pytest.fixture(scope="module")
def pythia_hf(pythia_tp2_pp2, data, tmp_path_factory):
    """The trained checkpoint exported by running the script as a user does."""
    out = tmp_path_factory.mktemp("pythia_hf")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools/ckpts/convert_neox_to_hf.py"), "--input_dir",
         str(pythia_tp2_pp2), "--config_file", "configs/tiny.yml", str(data[2]),
         "--output_dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


def llama_args(paths: Path, *overrides: str) -> NeoXArgs:
    return NeoXArgs.from_ymls(["configs/tiny_llama.yml", paths], list(overrides))


@pytest.fixture(scope="module")
def llama_tp2(data, tmp_path_factory):
    """configs/tiny_llama.yml (GQA, SwiGLU, RMSNorm, untied) with random weights, written as a
    tensor-parallel-2 checkpoint: (step dir, canonical weights, ModelConfig)."""
    args = llama_args(data[2], "model_parallel_size=2")
    tokenizer = build_tokenizer("HFTokenizer", str(args.tokenizer.vocab_file))
    padded = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by, 2)
    config = model_config_from_args(args, padded)
    canonical = random_weights(config)
    root = tmp_path_factory.mktemp("llama_ckpt")
    return write_weights_checkpoint(root, 5, canonical, args, tp=2), canonical, config


def test_pythia_checkpoint_tp2_pp2_exports_to_gpt_neox_with_our_logits(pythia_tp2_pp2,
                                                                       pythia_hf):
    ck = read_checkpoint(str(pythia_tp2_pp2.parent), 2)
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    tokens = batch(ck.trained_vocab)
    theirs, model = hf_logits(pythia_hf, tokens)
    assert type(model).__name__ == "GPTNeoXForCausalLM"
    saved = json.loads((pythia_hf / "config.json").read_text())
    dtype = saved.get("dtype", saved.get("torch_dtype"))  # the key's name before transformers 5
    assert (saved["model_type"], saved["vocab_size"], dtype) == ("gpt_neox", 2048, "float32")
    assert saved["use_parallel_residual"] is True
    assert (our_logits(config, ck.canonical, tokens) - theirs).abs().max().item() < ATOL


def test_exported_tokenizer_encodes_like_ours(pythia_hf, data):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(pythia_hf)
    ours = build_tokenizer("HFTokenizer", str(data[1]))
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.tokenize(text)
    assert (theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id) == (ours.eod, ours.eod,
                                                                               ours.pad)
    generation = json.loads((pythia_hf / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ours.eod


@pytest.mark.parametrize("kind", ["GPT2BPETokenizer", "HFGPT2Tokenizer", "CharLevelTokenizer"])
def test_tokenizer_files_are_written_for_tokenizers_hugging_face_can_load(kind, data, tmp_path,
                                                                          caplog):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    vocab, merges = Tokenizer.from_file(str(data[1])).model.save(str(tmp_path))  # GPT-2 files
    ours = build_tokenizer(kind, vocab, merges)
    written = write_hf_tokenizer(ours, tmp_path, 128)
    if kind == "CharLevelTokenizer":
        assert not written and not (tmp_path / "tokenizer.json").exists()
        assert "CharLevelTokenizer has no Hugging Face tokenizer form" in caplog.text
        return
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    assert [theirs(t)["input_ids"] for t in TEXTS] == [ours.tokenize(t) for t in TEXTS]
    assert (theirs.eos_token_id, theirs.pad_token_id) == (ours.eod, ours.pad)


def test_llama_checkpoint_tp2_exports_to_llama_with_our_logits(llama_tp2, tmp_path):
    step_dir, canonical, config = llama_tp2
    out = tmp_path / "hf"
    # no --config_file: the checkpoint's own config.yml gives model and tokenizer
    assert tool("convert_neox_to_hf").main(["--input_dir", str(step_dir.parent),
                                            "--output_dir", str(out)]) == 0
    tokens = batch(config.padded_vocab_size, seed=1)
    theirs, model = hf_logits(out, tokens)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (model.config.num_key_value_heads, model.config.tie_word_embeddings) == (2, False)
    assert (our_logits(config, canonical, tokens) - theirs).abs().max().item() < ATOL


def test_precision_bf16_writes_bf16_weights(llama_tp2, tmp_path):
    from safetensors.torch import load_file

    step_dir, canonical, _ = llama_tp2
    out = tmp_path / "hf"
    assert tool("convert_neox_to_hf").main(["--input_dir", str(step_dir), "--output_dir", str(out),
                                            "--precision", "bf16"]) == 0
    tensors = load_file(out / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert torch.equal(tensors["model.embed_tokens.weight"],
                       canonical["0.word_embeddings.weight"].bfloat16())


@pytest.mark.parametrize("kind", ["pythia", "llama"])
def test_neox_to_hf_to_neox_is_bitwise_identical(kind, llama_tp2, data, tmp_path, request):
    if kind == "pythia":
        step_dir, hf_dir = (request.getfixturevalue(f) for f in ("pythia_tp2_pp2", "pythia_hf"))
        configs = ["configs/tiny.yml", str(data[2])]
    else:
        step_dir, hf_dir = llama_tp2[0], tmp_path / "hf"
        configs = ["configs/tiny_llama.yml", str(data[2])]
        assert tool("convert_neox_to_hf").main(["--input_dir", str(step_dir),
                                                "--output_dir", str(hf_dir)]) == 0
    back = tmp_path / "back"
    assert tool("convert_hf_to_neox").main(["--hf_model", str(hf_dir), "--config_file", *configs,
                                            "--output_dir", str(back), "--tp", "2"]) == 0
    original, restored = full_weights(step_dir), full_weights(
        back / "global_step0")
    assert original.keys() == restored.keys()
    for name, tensor in original.items():
        assert torch.equal(restored[name], tensor), name


def random_hf(model, seed: int = 0):
    """Perturb every parameter, so that a dropped or swapped tensor shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def hf_gpt_neox(vocab: int = 2000, **overrides):
    """An HF GPTNeoXForCausalLM with configs/tiny.yml's shape."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    shape = dict(vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512, rotary_pct=0.25, use_parallel_residual=True,
                 max_position_embeddings=128, tie_word_embeddings=False)
    return random_hf(GPTNeoXForCausalLM(GPTNeoXConfig(**{**shape, **overrides})))


def hf_llama():
    """An HF LlamaForCausalLM with configs/tiny_llama.yml's shape (grouped-query attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return random_hf(LlamaForCausalLM(LlamaConfig(
        vocab_size=2048, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=192, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=False)))


@pytest.mark.parametrize("kind", ["gpt_neox_padded", "llama_sharded"])
def test_hf_model_imports_with_hf_logits(kind, data, tmp_path):
    configs = [str(data[2])]
    if kind == "gpt_neox_padded":  # HF rows 2056 < the config's padded vocabulary 3072
        hf, yml, padded = hf_gpt_neox(vocab=2056), "configs/tiny.yml", 3072
        (tmp_path / "pad.yml").write_text("make_vocab_size_divisible_by: 1536\n")
        configs.append(str(tmp_path / "pad.yml"))
        hf.save_pretrained(tmp_path / "hf")
    else:
        hf, yml, padded = hf_llama(), "configs/tiny_llama.yml", 2048
        hf.save_pretrained(tmp_path / "hf", max_shard_size="300KB")
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert tool("convert_hf_to_neox").main([
        "--hf_model", str(tmp_path / "hf"), "--config_file", yml, *configs,
        "--output_dir", str(tmp_path / "ckpt"), "--tp", "2", "--iteration", "3"]) == 0

    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step3"
    ck = read_checkpoint(str(tmp_path / "ckpt"), None)
    assert (ck.trained_vocab, ck.tensor_parallel) == (padded, 2)
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    rows = hf.config.vocab_size
    tokens = batch(rows)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    ours = our_logits(config, ck.canonical, tokens)
    assert (ours[..., :rows] - theirs).abs().max().item() < ATOL
    assert torch.all(ck.canonical["0.word_embeddings.weight"][rows:] == 0)  # padded rows


def test_imported_hf_model_loads_into_training_with_every_weight_in_place(data, tmp_path):
    """HF Llama -> tensor-parallel-2 checkpoint -> a one-process training run (another layout)
    at a learning rate too small to move any weight: its next checkpoint holds the same bits."""
    hf_llama().save_pretrained(tmp_path / "hf")
    assert tool("convert_hf_to_neox").main([
        "--hf_model", str(tmp_path / "hf"), "--config_file", "configs/tiny_llama.yml",
        str(data[2]), "--output_dir", str(tmp_path / "imported"), "--tp", "2",
        "--iteration", "3"]) == 0
    overrides = tiny_overrides(data[0], data[1], tmp_path / "run", num_gpus=1, train_iters=4,
                               checkpoint_factor=4, load=tmp_path / "imported", seq_length=SEQ,
                               eval_interval=1000, log_interval=1, min_lr=0,
                               **{"optimizer.params.lr": 1e-30})
    proc = launch_in_process("train.py", "configs/tiny_llama.yml", *overrides)
    assert proc.returncode == 0, explain(proc)
    imported = full_weights(tmp_path / "imported" / "global_step3")
    trained = full_weights(tmp_path / "run" / "ckpt" / "global_step4")
    assert trained.keys() == imported.keys()
    assert all(torch.equal(trained[k], imported[k]) for k in imported)


def test_weights_only_checkpoint_reads_back_exactly_with_a_complete_manifest(llama_tp2):
    step_dir, canonical, config = llama_tp2
    restored = full_weights(step_dir)
    assert restored.keys() == canonical.keys()
    assert all(torch.equal(restored[k], canonical[k]) for k in canonical)
    manifest = read_manifest(step_dir)
    assert manifest.contents == {"optimizer": False, "rng": False, "engine": False}
    assert manifest.run == {"tp": 2, "pp": 1, "pipe_parallel_size": 1, "dp": None,
                            "world_size": None, "zero_stage": None, "precision": "fp32",
                            "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
                            "num_kv_heads": 2, "intermediate_size": 192,
                            "padded_vocab_size": 2048, "moe_num_experts": 1,
                            "moe_expert_interval": 1, "mamba_layers": [],
                            "mamba_inner_size": 0, "value_head": False}
    assert (manifest.iteration, manifest.client_state) == (5, {"iteration": 5})
    assert check_files(step_dir, manifest, hash_names=manifest.files) == []
    on_disk = {p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file()}
    assert on_disk == set(manifest.files) | {"manifest.json"}
    assert sorted(p.name for p in step_dir.parent.iterdir()) == [step_dir.name, "latest"]
    with pytest.raises(FileExistsError, match="already exists"):
        write_weights_checkpoint(step_dir.parent, 5, canonical,
                                 NeoXArgs.from_yml_saved(step_dir / "config.yml"), tp=2)


def test_architecture_hugging_face_cannot_hold_is_refused_with_the_reasons(data, tmp_path,
                                                                          capsys):
    args = NeoXArgs.from_ymls(["configs/tiny.yml", data[2]], ["pos_emb=alibi"])
    config = model_config_from_args(args, 2048)
    write_weights_checkpoint(tmp_path / "ckpt", 1, random_weights(config), args, tp=1)
    assert tool("convert_neox_to_hf").main(["--input_dir", str(tmp_path / "ckpt"),
                                            "--output_dir", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "cannot be expressed as any Hugging Face architecture" in err
    assert "GPTNeoX: pos_emb 'alibi'" in err and "Llama: pos_emb 'alibi'" in err
    assert "norm 'layernorm' with bias True (Llama: RMSNorm, no bias)" in err
    assert not (tmp_path / "hf").exists()


def test_an_output_dir_that_cannot_be_written_is_refused_before_any_weight_is_read(
        data, tmp_path, capsys):
    args = NeoXArgs.from_ymls(["configs/tiny.yml", data[2]])
    write_weights_checkpoint(tmp_path / "ckpt", 1, random_weights(model_config_from_args(
        args, 2048)), args, tp=1)
    (tmp_path / "file").write_text("x")
    assert tool("convert_neox_to_hf").main(["--input_dir", str(tmp_path / "ckpt"),
                                            "--output_dir", str(tmp_path / "file" / "hf")]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --output_dir: {tmp_path}/file/hf cannot be made: {tmp_path}/file is a file, not "
        "a directory; choose another path")
    export = tool("convert_neox_to_hf").main(["--input_dir", str(tmp_path / "ckpt"),
                                              "--output_dir", str(tmp_path / "hf")])
    assert export == 0  # the same checkpoint, to a directory that can be made
    assert tool("convert_hf_to_neox").main([
        "--hf_model", str(tmp_path / "hf"), "--config_file", "configs/tiny.yml", str(data[2]),
        "--output_dir", "/proc/neox-test"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --output_dir: cannot create /proc/neox-test: /proc is not writable (No such file "
        "or directory); choose a directory this user can write to")


def test_config_differing_from_the_checkpoint_is_refused_naming_key_and_values(
        pythia_tp2_pp2, data, tmp_path, capsys):
    wrong = tmp_path / "wrong.yml"
    wrong.write_text("rotary_pct: 0.5\n")
    code = tool("convert_neox_to_hf").main([
        "--input_dir", str(pythia_tp2_pp2), "--config_file", "configs/tiny.yml", str(data[2]),
        str(wrong), "--output_dir", str(tmp_path / "hf")])
    assert code == 1
    assert "rotary_pct: 0.5 in this run's config vs 0.25 in the checkpoint's" in \
        capsys.readouterr().err


def test_hf_model_differing_from_the_config_is_refused_naming_key_and_values(data, tmp_path,
                                                                            capsys):
    hf_gpt_neox(vocab=4096, hidden_act="relu", layer_norm_eps=1e-6).save_pretrained(
        tmp_path / "hf")
    code = tool("convert_hf_to_neox").main([
        "--hf_model", str(tmp_path / "hf"), "--config_file", "configs/tiny.yml", str(data[2]),
        "--output_dir", str(tmp_path / "ckpt")])
    assert code == 1
    err = capsys.readouterr().err
    where = tmp_path / "hf" / "config.json"
    assert f"activation: 'gelu' in the config vs 'relu' in {where}" in err
    assert f"(layernorm_epsilon / rms_norm_epsilon): 1e-05 in the config vs 1e-06 in {where}" in err
    assert f"{where} has vocab_size 4096 but the config pads its tokenizer's vocabulary " \
           "only to 2048 rows" in err
    assert not (tmp_path / "ckpt").exists()


def test_missing_inputs_are_named(data, tmp_path, capsys):
    missing = tmp_path / "nowhere" / "global_step3"
    assert tool("convert_neox_to_hf").main(["--input_dir", str(missing), "--config_file",
                                            "configs/tiny.yml", str(data[2]),
                                            "--output_dir", str(tmp_path / "hf")]) == 1
    assert f"checkpoint directory {missing} does not exist" in capsys.readouterr().err
    assert tool("convert_hf_to_neox").main(["--hf_model", str(tmp_path / "hf_missing"),
                                            "--config_file", "configs/tiny.yml", str(data[2]),
                                            "--output_dir", str(tmp_path / "ckpt")]) == 1
    assert (f"Hugging Face model directory {tmp_path / 'hf_missing'} does not exist (only local "
            "directories are read; nothing is downloaded)") in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(hf_llama().config.to_json_string())
    assert tool("convert_hf_to_neox").main(["--hf_model", str(tmp_path / "empty"),
                                            "--config_file", "configs/tiny_llama.yml",
                                            str(data[2]), "--output_dir", str(tmp_path / "c")]) == 1
    assert f"{tmp_path / 'empty'} holds no weights: expected one of model.safetensors" in \
        capsys.readouterr().err


def test_export_without_output_dir_goes_beside_the_checkpoint_with_the_umask(llama_tp2):
    step_dir, _, _ = llama_tp2
    proc = subprocess.run([sys.executable, str(ROOT / "tools/ckpts/convert_neox_to_hf.py"),
                           "--input_dir", str(step_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, umask=0o027)
    assert proc.returncode == 0, proc.stderr
    out = step_dir.parent / "hf" / step_dir.name
    assert f" to {out}\n" in proc.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~0o027}, modes


def test_tanh_gelu_maps_to_bias_gelu_fusion_both_ways(data, tmp_path, capsys):
    """HF's tanh GELUs are GPT-NeoX's bias_gelu_fusion GELU: a config without the flag is
    refused naming it, one with it imports with HF's logits and exports as gelu_pytorch_tanh."""
    torch.manual_seed(0)
    hf = hf_gpt_neox(vocab=2048, hidden_act="gelu_new", initializer_range=0.5)  # tanh != erf here
    hf.save_pretrained(tmp_path / "hf")
    args = ["--hf_model", str(tmp_path / "hf"), "--config_file", "configs/tiny.yml", str(data[2])]
    assert tool("convert_hf_to_neox").main([*args, "--output_dir", str(tmp_path / "no")]) == 1
    where = tmp_path / "hf" / "config.json"
    assert (f"GELU approximation (bias_gelu_fusion): 'none' in the config vs 'tanh' in {where}"
            in capsys.readouterr().err)
    flag = tmp_path / "flag.yml"
    flag.write_text("bias_gelu_fusion: true\n")
    assert tool("convert_hf_to_neox").main([*args, str(flag), "--output_dir",
                                            str(tmp_path / "ckpt")]) == 0
    ck = read_checkpoint(str(tmp_path / "ckpt"), None)
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    assert config.gelu_approximation == "tanh"
    tokens = batch(2048)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    ours = our_logits(config, ck.canonical, tokens)[..., :2048]
    # logits of order 10 at this initializer_range, where fp32 kernels that sum in another
    # order (attention: HF's SDPA, our blocked CPU kernel) differ by up to about 5e-5 of them
    tol = 1e-4 * theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() < tol
    erf = our_logits(dataclasses.replace(config, bias_gelu_fusion=False), ck.canonical, tokens)
    assert (erf[..., :2048] - theirs).abs().max().item() > 5 * tol  # the flag matters here

    assert tool("convert_neox_to_hf").main([
        "--input_dir", str(tmp_path / "ckpt" / "global_step0"), "--config_file",
        "configs/tiny.yml", str(data[2]), str(flag), "--output_dir", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["hidden_act"] == \
        "gelu_pytorch_tanh"
    again, _ = hf_logits(tmp_path / "out", tokens)
    assert (again[..., :2048] - theirs).abs().max().item() < tol


MIXTRAL_KEYS = ("moe_num_experts: 4\nmoe_top_k: 2\nmoe_router_type: topk\n"
                "moe_normalize_topk: true\nmoe_aux_loss_coeff: 0.02\n")


def hf_mixtral():
    """An HF MixtralForCausalLM with configs/tiny_llama.yml's attention and 4 experts of its
    MLP's width in every layer, 2 per token."""
    from transformers import MixtralConfig, MixtralForCausalLM

    return random_hf(MixtralForCausalLM(MixtralConfig(
        vocab_size=2048, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=192, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=False, num_local_experts=4,
        num_experts_per_tok=2, router_aux_loss_coef=0.02, rope_theta=10000.0)))


def test_mixtral_imports_at_tp2_with_hf_logits_and_exports_back_bitwise(data, tmp_path):
    hf = hf_mixtral()
    hf.save_pretrained(tmp_path / "hf")
    moe = tmp_path / "moe.yml"
    moe.write_text(MIXTRAL_KEYS)
    configs = ["configs/tiny_llama.yml", str(data[2]), str(moe)]
    assert tool("convert_hf_to_neox").main([
        "--hf_model", str(tmp_path / "hf"), "--config_file", *configs,
        "--output_dir", str(tmp_path / "ckpt"), "--tp", "2"]) == 0
    ck = read_checkpoint(str(tmp_path / "ckpt"), None)
    assert ck.tensor_parallel == 2
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    assert ck.canonical["1.mlp.experts.w_in"].shape == (4, 2 * 192, 128)  # merged from 2 ranks
    tokens = batch(2048, seed=2)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    assert (our_logits(config, ck.canonical, tokens) - theirs).abs().max().item() < ATOL

    out = tmp_path / "back"
    assert tool("convert_neox_to_hf").main(["--input_dir", str(tmp_path / "ckpt"),
                                            "--output_dir", str(out)]) == 0
    again, model = hf_logits(out, tokens)
    assert type(model).__name__ == "MixtralForCausalLM"
    assert (model.config.num_local_experts, model.config.num_experts_per_tok,
            model.config.router_aux_loss_coef) == (4, 2, 0.02)
    assert torch.equal(again, theirs)
    original = hf.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_an_moe_model_is_refused_by_the_dense_architectures(llama_tp2, data, tmp_path):
    from megatron.model.hf_mapping import architecture_for

    _, _, config = llama_tp2
    sinkhorn = dataclasses.replace(config, moe_num_experts=4, moe_top_k=2)
    with pytest.raises(ValueError) as e:
        architecture_for(sinkhorn)
    msg = str(e.value)
    assert "GPTNeoX: " in msg and "moe_num_experts 4 (GPTNeoX has dense MLPs only)" in msg
    assert "moe_num_experts 4 (Llama has dense MLPs only)" in msg
    assert ("moe_router_type sinkhorn with moe_normalize_topk False (Mixtral routes to the "
            "normalised top k: topk, true)") in msg
    assert architecture_for(dataclasses.replace(sinkhorn, moe_router_type="topk",
                                                moe_normalize_topk=True)) == "mixtral"


MAMBA_ONLY = '{attention_config: [[[mamba], 4]], pipe_partition_method: "type:mamba"}\n'


@pytest.fixture(scope="module")
def mamba_tp2(data, tmp_path_factory):
    """configs/tiny_mamba.yml with Mamba layers only (what Hugging Face's Mamba holds), random
    weights, written as a tensor-parallel-2 checkpoint: (step dir, canonical, ModelConfig,
    the config files)."""
    root = tmp_path_factory.mktemp("mamba_ckpt")
    (root / "mamba_only.yml").write_text(MAMBA_ONLY)
    configs = ["configs/tiny.yml", "configs/tiny_mamba.yml", str(root / "mamba_only.yml"),
               str(data[2])]
    args = NeoXArgs.from_ymls(configs, ["model_parallel_size=2"])
    tokenizer = build_tokenizer("HFTokenizer", str(args.tokenizer.vocab_file))
    padded = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by, 2)
    config = model_config_from_args(args, padded)
    canonical = random_weights(config)
    return write_weights_checkpoint(root, 3, canonical, args, tp=2), canonical, config, configs


def test_mamba_checkpoint_tp2_exports_to_hugging_face_mamba_and_back(mamba_tp2, tmp_path):
    step_dir, canonical, config, configs = mamba_tp2
    out = tmp_path / "hf"
    assert tool("convert_neox_to_hf").main(["--input_dir", str(step_dir),
                                            "--output_dir", str(out)]) == 0
    tokens = batch(config.padded_vocab_size, seed=2)
    theirs, model = hf_logits(out, tokens)
    assert type(model).__name__ == "MambaForCausalLM"
    assert (model.config.expand, model.config.residual_in_fp32) == (2, False)
    assert (our_logits(config, canonical, tokens) - theirs).abs().max().item() < ATOL
    back = tmp_path / "back"
    assert tool("convert_hf_to_neox").main(["--hf_model", str(out), "--config_file", *configs,
                                            "--output_dir", str(back), "--tp", "2"]) == 0
    restored = full_weights(back / "global_step0")
    assert restored.keys() == canonical.keys()
    for name, tensor in canonical.items():
        assert torch.equal(restored[name], tensor), name


def test_mamba_checkpoint_exports_in_mamba_ssm_format(mamba_tp2, tmp_path):
    """GPT-NeoX's convert_neox_to_mamba_ssm.py layout: config.json with mamba_ssm's
    MambaConfig fields, pytorch_model.bin with MambaLMHeadModel's names; renamed to Hugging
    Face's (`embedding` -> `embeddings`) the tensors give HF's Mamba our logits."""
    from transformers import MambaConfig, MambaForCausalLM

    step_dir, canonical, config, _ = mamba_tp2
    out = tmp_path / "mamba_ssm"
    assert tool("convert_neox_to_hf").main(["--input_dir", str(step_dir), "--output_dir",
                                            str(out), "--architecture", "mamba_ssm"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == {"d_model": 128, "d_intermediate": 0, "n_layer": 4,
                   "vocab_size": config.padded_vocab_size, "ssm_cfg": {}, "attn_layer_idx": [],
                   "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": False,
                   "fused_add_norm": True, "pad_vocab_size_multiple": 1, "tie_embeddings": True}
    state = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert "backbone.embedding.weight" in state and "backbone.layers.3.mixer.A_log" in state
    hf = MambaForCausalLM(MambaConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], num_hidden_layers=cfg["n_layer"],
        residual_in_fp32=False, tie_word_embeddings=True, layer_norm_epsilon=1e-5)).eval()
    renamed = {k.replace("backbone.embedding.", "backbone.embeddings."): v for k, v in state.items()}
    missing, unexpected = hf.load_state_dict(renamed, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    tokens = batch(config.padded_vocab_size, seed=3)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    assert (our_logits(config, canonical, tokens) - theirs).abs().max().item() < ATOL


def test_flash_attention_without_a_window_exports_as_hugging_faces_attention(data, tmp_path):
    """attention_config flash (GPT-NeoX's Pythia and Llama configs) computes global attention:
    an HF model imported with it exports back with the same logits; a window is still refused."""
    from megatron.model.hf_mapping import architecture_for

    hf = hf_gpt_neox(vocab=2048)
    hf.save_pretrained(tmp_path / "hf")
    flash = tmp_path / "flash.yml"
    flash.write_text('attention_config: [[["flash"], 4]]\n')
    configs = ["configs/tiny.yml", str(data[2]), str(flash)]
    assert tool("convert_hf_to_neox").main(["--hf_model", str(tmp_path / "hf"), "--config_file",
                                            *configs, "--output_dir", str(tmp_path / "ckpt")]) == 0
    ck = read_checkpoint(str(tmp_path / "ckpt"), None)
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    assert config.attention_types == ("flash",) * 4
    assert tool("convert_neox_to_hf").main(["--input_dir", str(tmp_path / "ckpt"),
                                            "--output_dir", str(tmp_path / "back")]) == 0
    tokens = batch(2048, seed=4)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    again, model = hf_logits(tmp_path / "back", tokens)
    assert type(model).__name__ == "GPTNeoXForCausalLM" and torch.equal(again, theirs)
    with pytest.raises(ValueError, match=r"GPTNeoX: attention types \['flash'\] \(GPTNeoX: global "
                                         r"only, or flash without a window\)"):
        architecture_for(dataclasses.replace(config, sliding_window_width=16))


def test_mixtrals_jitter_and_balance_coefficient_are_named_where_not_carried_over(
        data, tmp_path, capsys):
    """Mixtral's router_jitter_noise scales what the router and the experts read, GPT-NeoX's
    moe_jitter_eps the router's input only: an import says it does not take it, and that the
    config's moe_aux_loss_coeff is trained with where config.json has another coefficient; an
    export of a model trained with moe_jitter_eps writes router_jitter_noise 0 and says so."""
    from transformers import MixtralConfig, MixtralForCausalLM

    hf = random_hf(MixtralForCausalLM(MixtralConfig(
        vocab_size=2048, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=192, max_position_embeddings=128,
        tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2,
        router_aux_loss_coef=0.001, router_jitter_noise=0.1, rope_theta=10000.0)))
    hf.save_pretrained(tmp_path / "hf")
    moe = tmp_path / "moe.yml"
    moe.write_text(MIXTRAL_KEYS)
    configs = ["configs/tiny_llama.yml", str(data[2]), str(moe)]
    capsys.readouterr()
    assert tool("convert_hf_to_neox").main(["--hf_model", str(tmp_path / "hf"), "--config_file",
                                            *configs, "--output_dir", str(tmp_path / "ckpt")]) == 0
    err = capsys.readouterr().err
    where = tmp_path / "hf" / "config.json"
    assert (f"{where}: router_jitter_noise 0.1 is not carried over: Mixtral scales what the "
            "router and the experts read, moe_jitter_eps (GPT-NeoX's) the router's input only; "
            "training takes the config's moe_jitter_eps (None)") in err, err
    assert (f"{where}: router_aux_loss_coef 0.001 is not the config's moe_aux_loss_coeff 0.02, "
            "which training takes") in err

    jitter = tmp_path / "jitter.yml"
    jitter.write_text("moe_jitter_eps: 0.01\n")
    assert tool("convert_neox_to_hf").main([
        "--input_dir", str(tmp_path / "ckpt"), "--config_file", *configs, str(jitter),
        "--output_dir", str(tmp_path / "back")]) == 0
    assert "moe_jitter_eps 0.01 is not exported" in capsys.readouterr().err
    exported = json.loads((tmp_path / "back" / "config.json").read_text())
    assert exported["router_jitter_noise"] == 0.0 and exported["router_aux_loss_coef"] == 0.02


def test_a_mamba_models_fp32_residual_is_named_where_the_run_sums_in_another_dtype():
    from transformers import MambaConfig

    from megatron.model import hf_mamba

    hf_cfg = MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=300)
    assert hf_cfg.residual_in_fp32  # Hugging Face's default
    assert hf_mamba.import_notes(hf_cfg, None, "fp32") == []
    assert hf_mamba.import_notes(hf_cfg, None, "bf16") == [
        "residual_in_fp32 true is not carried over: the residual stream is kept in bf16, as in "
        "GPT-NeoX's Mamba layers (its sums round to bf16 where the Hugging Face model sums in "
        "fp32; an fp32 run computes the same)"]
    hf_cfg.residual_in_fp32 = False
    assert hf_mamba.import_notes(hf_cfg, None, "bf16") == []
