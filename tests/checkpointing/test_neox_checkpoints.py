"""Checkpoints written by GPT-NeoX load here: recognised (not "damaged"), read at any tensor-
parallel degree in both of GPT-NeoX's shapes (pipeline layer files, sequential module), with
GPT-NeoX's tensor layouts (grouped-query QKV per rank, gated-MLP halves, older MLP names,
mixture-of-experts routers and grouped expert weights).

The directories are built from Hugging Face models by tests/checkpointing/neox_dirs.py
following GPT-NeoX's conventions; the logits of what the reader returns must equal the HF
model's (fp32, within 2e-5 absolute, as the HF conversion tests). No HF model has GPT-NeoX's
MoE layer: its directories are written from a model of ours, and a test computes GPT-NeoX's
expert formula from the files alone.
"""

from __future__ import annotations

import pytest
import torch

from megatron.checkpointing.errors import CheckpointMismatchError, CorruptFileError
from megatron.checkpointing.locate import open_verified
from megatron.checkpointing.reader import read_checkpoint
from megatron.neox_arguments import NeoXArgs
from tests.checkpointing.neox_dirs import (gpt_neox_layers, llama_layers, mamba_layers,
                                           moe_layers, write_neox_checkpoint)
from tests.tools.test_hf_conversion import ATOL, batch, hf_gpt_neox, hf_llama, our_logits, tool
from tests.model.test_mamba import _hf_model as hf_mamba

LLAMA_CONFIG = {  # GPT-NeoX's spelling: dashes where its own configs use them
    "num-layers": 4, "hidden-size": 128, "num-attention-heads": 4, "num_kv_heads": 2,
    "seq-length": 128, "max-position-embeddings": 128, "pos-emb": "rotary", "rotary_pct": 1,
    "norm": "rmsnorm", "rms_norm_epsilon": 1.0e-5, "activation": "swiglu",
    "mlp_multiple_of": 64, "use_bias_in_norms": False, "use_bias_in_attn_linear": False,
    "use_bias_in_mlp": False, "no-weight-tying": True, "pipe-parallel-size": 1,
    "model-parallel-size": 2, "launcher": "pdsh", "train-iters": 320000}
PYTHIA_ARGS = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
               "max_position_embeddings": 128, "make_vocab_size_divisible_by": 128,
               "padded_vocab_size": 2048, "tokenizer_type": "HFTokenizer",
               "model_parallel_size": 2}


@pytest.fixture(scope="module")
def paths(small_data, tmp_path_factory):
    prefix, tokenizer = small_data
    path = tmp_path_factory.mktemp("neox_paths") / "paths.yml"
    path.write_text(f"vocab_file: {tokenizer}\ndata_path: {prefix}\n")
    return path


def run_args(config: str, paths, *overrides: str) -> NeoXArgs:
    return NeoXArgs.from_ymls([config, paths], list(overrides))


CASES = {
    # GPT-NeoX training output: pipeline files, tensor-parallel 2, configs saved
    "llama_gqa_pipeline_tp2": ("llama", "pipeline", 2, "configs"),
    # GPT-NeoX's convert_hf_llama_to_neox.py: sequential, tag "0", no configs or args
    "llama_gqa_converted_tp2": ("llama", "sequential", 2, "converter"),
    # Pythia-style: older MLP names, rotary buffers, only the args GPT-NeoX stores
    "pythia_pipeline_tp2_legacy_names": ("gpt_neox", "pipeline", 2, "args"),
    "pythia_sequential_tp1": ("gpt_neox", "sequential", 1, "args"),
    # a Mamba model as GPT-NeoX's configs/mamba/*.yml train it (pipe_parallel_size 0), untied,
    # no position table
    "mamba_sequential_tp1": ("mamba", "sequential", 1, "configs"),
}
MAMBA_CONFIG = {  # GPT-NeoX's spelling, as its mamba-130M.yml writes it, at a tiny size
    "num-layers": 2, "hidden-size": 64, "num-attention-heads": 4, "seq-length": 128,
    "max-position-embeddings": 128, "pos-emb": "none", "no-weight-tying": True,
    "attention-config": [[["mamba"], 2]], "norm": "rmsnorm", "rms_norm_epsilon": 1.0e-5,
    "mamba_use_bias_in_conv": True, "mamba_use_bias_in_linears": False,
    "make_vocab_size_divisible_by": 128, "pipe-parallel-size": 0, "model-parallel-size": 1}
MAMBA_RUN = ["num_layers=2", "hidden_size=64", "num_attention_heads=4", "seq_length=128",
             "max_position_embeddings=128", "pos_emb=none", "no_weight_tying=true",
             "attention_config=[[[mamba], 2]]", "norm=rmsnorm", "rms_norm_epsilon=1.0e-5",
             "pipe_partition_method=type:mamba"]
MOE_CONFIG = {  # GPT-NeoX's spelling; its 125M-dmoe.yml's MoE keys at the tiny model's size
    "num-layers": 4, "hidden-size": 128, "num-attention-heads": 4, "seq-length": 128,
    "max-position-embeddings": 128, "pos-emb": "rotary", "rotary-pct": 0.25,
    "norm": "layernorm", "activation": "gelu", "no-weight-tying": True, "moe_num_experts": 4,
    "moe_top_k": 2, "moe_expert_interval": 2, "moe_router_type": "sinkhorn",
    "pipe-parallel-size": 1, "model-parallel-size": 2}


def moe_args(paths, *overrides: str) -> NeoXArgs:
    return NeoXArgs.from_ymls(["configs/tiny.yml", "configs/tiny_moe.yml", paths],
                              ["gpt_j_residual=false", *overrides])


def moe_source(args):
    """(model config, canonical weights) of a freshly initialised MoE model of ours: experts
    in layers 0 and 2, 4 of them, 2 per token."""
    from megatron.model.config import model_config_from_args
    from megatron.model.gpt import GPTModel
    from megatron.model.partition import canonical_from_module

    config = model_config_from_args(args, 2048)
    model = GPTModel(config)
    return config, {k: v.detach().clone() for k, v in canonical_from_module(
        model.state_dict()).items()}


def build(case: str, root):
    """(the HF model, the checkpoint's save directory, the run config file it describes)."""
    kind, shape, tp, saved = CASES[case]
    if kind == "llama":
        hf, layers, config = hf_llama(), llama_layers, "configs/tiny_llama.yml"
    elif kind == "mamba":
        hf, layers, config = hf_mamba(tie_word_embeddings=False), mamba_layers, "configs/tiny.yml"
    else:
        hf, layers, config = hf_gpt_neox(vocab=2048), gpt_neox_layers, "configs/tiny.yml"
    write_neox_checkpoint(
        root, lambda r: layers(hf, tp, r), tp, shape, iteration=30,
        args=PYTHIA_ARGS | {"model_parallel_size": tp} if saved == "args" else None,
        configs=({"mamba.yml": MAMBA_CONFIG} if kind == "mamba" else {"llama.yml": LLAMA_CONFIG}
                 ) if saved == "configs" else None,
        tag="0" if saved == "converter" else None)
    return hf, root, config


@pytest.mark.parametrize("case", list(CASES))
def test_gpt_neox_checkpoint_reads_with_the_logits_of_the_model_it_came_from(case, paths,
                                                                             tmp_path):
    hf, root, config = build(case, tmp_path / "neox")
    # a run config for a Mamba model has no pipeline (or a partition its blocks match)
    args = run_args(config, paths, *(["pipe_parallel_size=0"] if "mamba" in case else []))
    ck = read_checkpoint(root, run_args=args)  # `latest` -> its tag; not refused as damaged
    assert ck.tensor_parallel == CASES[case][2]
    assert ck.iteration == 30
    model_config = ck.saved_model_config(args, ck.trained_vocab)
    tokens = batch(hf.config.vocab_size)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    ours = our_logits(model_config, ck.canonical, tokens)
    assert (ours - theirs).abs().max().item() < ATOL


def test_saved_configs_give_the_architecture_and_a_differing_run_config_is_refused(paths,
                                                                                   tmp_path):
    _, root, _ = build("llama_gqa_pipeline_tp2", tmp_path / "neox")
    wrong = run_args("configs/tiny_llama.yml", paths, "num_kv_heads=4")
    manifest = open_verified(root / "global_step30")
    assert manifest.run["num_kv_heads"] == 2 and manifest.run["tp"] == 2
    ck = read_checkpoint(root, run_args=run_args("configs/tiny_llama.yml", paths))
    saved = ck.saved_model_config(wrong, ck.trained_vocab)
    assert (saved.num_kv_heads, saved.activation, saved.norm) == (2, "swiglu", "rmsnorm")
    with pytest.raises(ValueError, match=r"num_kv_heads: 4 in this run's config vs 2"):
        from megatron.checkpointing.hf_export import exported_config
        from megatron.tokenizer import build_tokenizer

        tok = build_tokenizer("HFTokenizer", str(wrong.tokenizer.vocab_file))
        exported_config(wrong, ck, tok)


def test_missing_rank_file_is_named_and_unknown_tensors_are_refused(paths, tmp_path):
    _, root, _ = build("llama_gqa_pipeline_tp2", tmp_path / "neox")
    step = root / "global_step30"
    (step / "layer_03-model_01-model_states.pt").unlink()
    with pytest.raises(CorruptFileError, match=r"layer_03-model_01-model_states\.pt: missing"):
        open_verified(step)

    _, root, _ = build("pythia_sequential_tp1", tmp_path / "qk_norm")
    path = root / "global_step30" / "mp_rank_00_model_states.pt"
    state = torch.load(path, weights_only=False)
    state["module"]["sequential.2.attention.qk_layernorm.weight"] = torch.zeros(2)
    torch.save(state, path)
    with pytest.raises(CheckpointMismatchError, match=r"qk_layernorm\.weight.*QK layernorm"):
        read_checkpoint(root, run_args=run_args("configs/tiny.yml", paths))


def test_gpt_neox_checkpoint_exports_to_hugging_face_with_its_saved_configs(paths, tmp_path):
    """tools/ckpts/convert_neox_to_hf.py on a GPT-NeoX directory: the architecture comes from
    the configs GPT-NeoX saved when no config file is given; the run config adds the
    tokenizer."""
    from transformers import AutoModelForCausalLM

    hf, root, _ = build("llama_gqa_pipeline_tp2", tmp_path / "neox")
    assert tool("convert_neox_to_hf").main([
        "--input_dir", str(root), "--config_file", "configs/tiny_llama.yml", str(paths),
        "--output_dir", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = batch(hf.config.vocab_size)
    with torch.inference_mode():
        assert (exported(tokens).logits - hf(tokens).logits).abs().max().item() < ATOL


def _train_from_deepspeed_written(rank, world, root, paths, zero_stage, kind="llama"):
    """A GPT-NeoX checkpoint saved by a real DeepSpeed engine (one Adam step on the gradient
    g = W0 of HF Llama's weights W0), loaded into this project's training engine."""
    import deepspeed

    from megatron.checkpointing import load_checkpoint
    from megatron.model.config import model_config_from_args
    from megatron.model.hf_mapping import canonical_from_hf
    from megatron.model.partition import canonical_param_name
    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.initialize import disable_deepspeed_shm_allreduce
    from megatron.mpu.topology import Topology
    from megatron.training.engine import build_engine
    from megatron.training.learning_rates import AnnealingLR, lr_schedule
    from tests.checkpointing.neox_dirs import deepspeed_neox_checkpoint

    disable_deepspeed_shm_allreduce()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    common = ["num_gpus=1", f"load={root}", f"save={root}_ours", "lr_decay_style=constant",
              "warmup=0.0"]
    if kind == "llama":
        args = run_args("configs/tiny_llama.yml", paths, *common).with_world_size(1)
        hf, layers, vocab = hf_llama(), llama_layers, 2048
        saved = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
                 "padded_vocab_size": 2048, "model_parallel_size": 1}
        configs = {"llama.yml": LLAMA_CONFIG | {"model-parallel-size": 1}}
    elif kind == "mamba":  # the Mamba model of MAMBA_CONFIG, the run config saying the same
        args = run_args("configs/tiny.yml", paths, *common, *MAMBA_RUN).with_world_size(1)
        hf, layers, vocab = hf_mamba(tie_word_embeddings=False), mamba_layers, 128
        saved = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                 "padded_vocab_size": 128, "model_parallel_size": 1}
        configs = {"mamba.yml": MAMBA_CONFIG | {"pipe-parallel-size": 1,
                                                "pipe-partition-method": "type:mamba"}}
    else:  # the MoE model of MOE_CONFIG, from weights of ours
        args = moe_args(paths, *common).with_world_size(1)
        _, w0 = moe_source(args)
        hf, layers, vocab = None, lambda _, tp, r: moe_layers(w0, 4, tp, r), 2048
        saved = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
                 "padded_vocab_size": 2048, "model_parallel_size": 1}
        configs = {"moe.yml": MOE_CONFIG | {"model-parallel-size": 1}}
    if hf is not None:
        w0, _ = canonical_from_hf(hf.state_dict(), hf.config)
    schedule = lr_schedule(args)
    deepspeed_neox_checkpoint(
        root, layers(hf, 1, 0), zero_stage, iteration=5, lr=schedule.lr, args=saved,
        configs=configs, lr_scheduler=lambda opt: AnnealingLR(opt, schedule))
    topology = Topology.from_world(1, 1, args.parallelism.pipe_parallel_size)
    engine = build_engine(args, model_config_from_args(args, vocab), ProcessGroups.build(topology))
    resumed = load_checkpoint(engine, args.checkpoint)
    ds = engine.engine
    found = {}
    for name, p in ds.module.named_parameters():
        state = ds.optimizer.state[p]
        found[canonical_param_name(name)] = (p.detach().clone(), state["exp_avg"].clone(),
                                             state["exp_avg_sq"].clone())
    return (resumed, found, w0, schedule.lr, ds.global_steps,
            engine.lr_scheduler.state_dict()["num_iters"])


@pytest.mark.parametrize("zero_stage,kind", [(0, "llama"), (1, "llama"), (0, "mamba"),
                                             (1, "moe")])
def test_deepspeed_written_gpt_neox_checkpoint_continues_training_with_its_optimizer_state(
        zero_stage, kind, paths, tmp_path):
    """Continued training: iteration, LR schedule and Adam's moments come from the GPT-NeoX
    checkpoint. After one step on g = W0: exp_avg = 0.1 W0, exp_avg_sq = 0.05 W0^2 and
    W1 = W0 - lr W0 / (|W0| + eps), elementwise, so they are known in our layout from the
    source weights alone (HF's, or ours for the MoE model), whatever GPT-NeoX's layout of the
    files (its experts' w2 is transposed, moments too)."""
    from tests.distributed import run_distributed

    [(resumed, found, w0, lr, steps, num_iters)] = run_distributed(
        _train_from_deepspeed_written, 1, tmp_path / "neox", paths, zero_stage, kind)
    assert resumed["iteration"] == 5 and set(resumed) == {"iteration", "loaded_from"}
    assert (steps, num_iters) == (1, 1)
    assert found.keys() == w0.keys()
    for name, (weight, exp_avg, exp_avg_sq) in found.items():
        expected = w0[name] - lr * w0[name] / (w0[name].abs() + 1e-8)
        torch.testing.assert_close(weight, expected, rtol=0, atol=1e-6, msg=name)
        torch.testing.assert_close(exp_avg, 0.1 * w0[name], rtol=1e-5, atol=1e-8, msg=name)
        torch.testing.assert_close(exp_avg_sq, 0.05 * w0[name] ** 2, rtol=1e-4, atol=1e-9,
                                   msg=name)


@pytest.mark.parametrize("iteration", [0, 7, 50, 100, 120])
def test_a_gpt_neox_checkpoint_resumes_its_data_where_gpt_neox_would(iteration):
    """A GPT-NeoX checkpoint records no data position: it is where GPT-NeoX's data_utils puts
    its loaders on resuming (batches of micro-batch x data-parallel samples), with gradient
    accumulation 4 over 2 data-parallel ranks, where the two rules of validation differ."""
    from megatron.training.loop import implied_position

    args = NeoXArgs.from_ymls(["configs/tiny.yml"], [
        "train_micro_batch_size_per_gpu=3", "gradient_accumulation_steps=4",
        "train_batch_size=null", "eval_interval=50", "eval_iters=5"]).with_world_size(2)
    assert args.derived.train_batch_size == 24
    micro, gas, dp, eval_interval, eval_iters = 3, 4, 2, 50, 5
    # GPT-NeoX, megatron/data/data_utils.py (build_train_valid_test_data_loaders)
    train_start_iter = iteration * gas
    valid_start_iter = (iteration * gas) // eval_interval * eval_iters
    assert implied_position(args, iteration) == (train_start_iter * micro * dp,
                                                 valid_start_iter * micro * dp)
    # at 120: 45 batches of 6 samples, where the 2 evaluations that ran read 40
    if iteration == 120:
        assert implied_position(args, iteration) == (120 * 24, 45 * 6)


def test_gpt_neox_checkpoint_fine_tunes_through_deepy_at_another_layout(small_data, paths,
                                                                       tmp_path):
    """`finetune: true` from a GPT-NeoX tensor-parallel-2 pipeline checkpoint, trained by one
    process (tensor-parallel 1), at a learning rate too small to move a weight: the iteration
    count restarts and the first checkpoint holds the GPT-NeoX weights (HF's, in our layout)."""
    from megatron.checkpointing.weights import full_weights
    from megatron.model.hf_mapping import canonical_from_hf
    from tests.runs import deepy, explain, tiny_overrides

    hf, root, config = build("llama_gqa_pipeline_tp2", tmp_path / "neox")
    overrides = tiny_overrides(*small_data, tmp_path / "run", num_gpus=1, train_iters=2,
                               checkpoint_factor=2, load=root, finetune="true", seq_length=48,
                               eval_interval=1000, log_interval=1, min_lr=0,
                               **{"optimizer.params.lr": 1e-30})
    proc = deepy("train.py", config, *overrides)
    assert proc.returncode == 0, explain(proc)
    assert "was written by GPT-NeoX" in proc.stderr + proc.stdout
    assert (tmp_path / "run" / "ckpt" / "latest").read_text() == "global_step2"
    trained = full_weights(tmp_path / "run" / "ckpt" / "global_step2")
    expected, _ = canonical_from_hf(hf.state_dict(), hf.config)
    assert trained.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(trained[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_gpt_neox_checkpoint_is_read_as_a_reference_model_with_its_models_logits(paths,
                                                                                  tmp_path):
    """DPO / KTO fine-tuning from a GPT-NeoX checkpoint: the frozen reference model is that
    checkpoint (tensor-parallel 2, pipeline files), read whole for a one-process run; one of
    another architecture, or one deleted since the run started, is refused by name."""
    from megatron.model.config import model_config_from_args
    from megatron.training.reference import read_reference_weights

    hf, root, config = build("llama_gqa_pipeline_tp2", tmp_path / "neox")
    args = run_args(config, paths, "model_parallel_size=1")
    model_config = read_checkpoint(root, run_args=args).saved_model_config(args, 2048)
    weights = read_reference_weights(args, model_config, {"path": str(root / "global_step30"),
                                                          "iteration": 30})
    tokens = batch(hf.config.vocab_size)
    with torch.inference_mode():
        theirs = hf(tokens).logits
    ours = our_logits(model_config, weights, tokens)
    assert (ours[..., :hf.config.vocab_size] - theirs).abs().max().item() < ATOL
    # a reference of another architecture, or one deleted since the run started: refused
    other = run_args(config, paths, "model_parallel_size=1", "num_kv_heads=4")
    with pytest.raises(ValueError, match=r"num_kv_heads: 4 in this run's config vs 2"):
        read_reference_weights(other, model_config_from_args(other, 2048),
                               {"path": str(root / "global_step30"), "iteration": 30})
    with pytest.raises(FileNotFoundError, match=r"global_step7, is gone .*restore it"):
        read_reference_weights(args, model_config, {"path": str(root / "global_step7"),
                                                    "iteration": 7})


def test_generation_reads_a_gpt_neox_checkpoint_with_the_models_logits(paths, tmp_path):
    """generate.py and eval.py's model loader on a GPT-NeoX checkpoint (sequential, as GPT-NeoX's
    converter writes it, with no config: the run's config describes it)."""
    from megatron.mpu.groups import NO_TP
    from megatron.text_generation.runtime import load_inference_model
    from megatron.tokenizer import build_tokenizer

    hf, root, config = build("llama_gqa_converted_tp2", tmp_path / "neox")
    args = run_args(config, paths, f"load={root}")
    tokenizer = build_tokenizer("HFTokenizer", str(args.tokenizer.vocab_file))
    model, step_dir, iteration = load_inference_model(args, tokenizer, NO_TP,
                                                      torch.device("cpu"))
    assert (step_dir, iteration) == (str(root / "0"), 30)
    tokens = batch(hf.config.vocab_size)
    with torch.inference_mode():
        ours = model.forward(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))
        assert (ours - hf(tokens).logits).abs().max().item() < ATOL


def test_reshard_tool_rewrites_a_gpt_neox_checkpoint_in_this_projects_format(small_data, paths,
                                                                            tmp_path):
    """tools/ckpts/reshard.py on GPT-NeoX's pipeline checkpoint (Pythia-style names, tensor-
    parallel 2) at model_parallel_size 1: a verified checkpoint of ours, same iteration, the
    HF model's weights."""
    from megatron.checkpointing.locate import open_verified
    from megatron.checkpointing.weights import full_weights
    from megatron.model.hf_mapping import canonical_from_hf
    from tests.runs import deepy, explain, tiny_overrides

    hf, root, config = build("pythia_pipeline_tp2_legacy_names", tmp_path / "neox")
    overrides = tiny_overrides(*small_data, tmp_path / "out", num_gpus=1, load=root,
                               model_parallel_size=1)
    proc = deepy("tools/ckpts/reshard.py", config, *overrides)
    assert proc.returncode == 0, explain(proc)
    step = tmp_path / "out" / "ckpt" / "global_step30"
    assert open_verified(step).run["tp"] == 1  # a manifest of ours, every file hashed
    expected, _ = canonical_from_hf(hf.state_dict(), hf.config)
    restored = full_weights(step)
    assert restored.keys() == expected.keys()
    assert all(torch.equal(restored[k], expected[k]) for k in expected)


def test_inspect_describes_a_gpt_neox_checkpoint(paths, tmp_path):
    from megatron.checkpointing.summary import describe_checkpoint

    build("llama_gqa_pipeline_tp2", tmp_path / "neox")
    lines, problems = describe_checkpoint(tmp_path / "neox", verify=True)
    assert problems == []
    assert lines[0].endswith("written by GPT-NeoX")
    assert "tp 2" in lines[2]
    assert "num_kv_heads 2" in lines[3] and "padded_vocab_size 2048" in lines[3]
    assert lines[4] == "holds: weights"
    assert lines[-2] == ("optimizer state not read: it holds no optimizer state (e.g. written by "
                         "a GPT-NeoX converter)")


@pytest.mark.parametrize("shape,tp,saved", [("pipeline", 2, True), ("sequential", 1, False)])
def test_gpt_neox_moe_checkpoint_reads_with_the_logits_of_the_model_it_came_from(
        shape, tp, saved, paths, tmp_path):
    """GPT-NeoX's dropless MoE layers (router, grouped w1/w2 of each rank's experts) read into
    ours: the logits equal those of the model the files were written from. Without saved
    configs (a converter's output) the experts' layers give moe_expert_interval."""
    args = moe_args(paths)
    config, canonical = moe_source(args)
    root = tmp_path / "neox"
    write_neox_checkpoint(root, lambda r: moe_layers(canonical, 4, tp, r), tp, shape,
                          iteration=30, configs={"moe.yml": MOE_CONFIG | {
                              "model-parallel-size": tp}} if saved else None)
    manifest = open_verified(root / "global_step30")
    assert (manifest.run["moe_num_experts"], manifest.run["moe_expert_interval"]) == (4, 2)
    ck = read_checkpoint(root, run_args=args)
    assert ck.tensor_parallel == tp
    tokens = batch(2048)
    expected = our_logits(config, canonical, tokens)
    ours = our_logits(ck.saved_model_config(args, ck.trained_vocab), ck.canonical, tokens)
    assert (ours - expected).abs().max().item() < ATOL


def test_gpt_neox_moe_tensors_compute_gpt_neoxs_expert_formula_here(paths, tmp_path):
    """The layout read against GPT-NeoX's own formula, from its files alone: router logits
    x W_r^T; at inference the sinkhorn router takes the top 2 of their softmax; expert e of
    tensor rank r is gelu(x w1_e^T) w2_e with w1, w2 of that rank's file viewed [n, f, h]; the
    output is the weighted sum. Our MoE layer loaded from the checkpoint computes the same."""
    from megatron.text_generation.inference_model import InferenceModel

    args = moe_args(paths)
    config, canonical = moe_source(args)
    root = tmp_path / "neox"
    write_neox_checkpoint(root, lambda r: moe_layers(canonical, 4, 2, r), 2, "pipeline",
                          iteration=30, configs={"moe.yml": MOE_CONFIG})
    step = root / "global_step30"
    files = [torch.load(step / f"layer_04-model_{r:02d}-model_states.pt") for r in range(2)]
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(3))
    probs = torch.softmax(x @ files[0]["mlp.router.layer.weight"].T, dim=-1)
    weights, experts = torch.topk(probs, 2, dim=1)
    expected = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t], experts[t].tolist()):
            rank, local = divmod(e, 2)
            w1 = files[rank]["mlp.experts.mlp.w1"].view(2, -1, 128)[local]
            w2 = files[rank]["mlp.experts.mlp.w2"].view(2, -1, 128)[local]
            up = torch.nn.functional.gelu(x[t] @ w1.T, approximate=config.gelu_approximation)
            expected[t] += w * (up @ w2)
    ck = read_checkpoint(root, run_args=args)
    model = InferenceModel.from_canonical(ck.saved_model_config(args, ck.trained_vocab),
                                          ck.canonical)
    moe = model.model.layers[3].mlp  # transformer layer 2 (GPT-NeoX's file layer_04)
    with torch.inference_mode():
        torch.testing.assert_close(moe(x.unsqueeze(0))[0], expected, rtol=1e-5, atol=1e-6)


def test_gpt_neox_moe_checkpoint_of_another_shape_is_refused_by_name(paths, tmp_path):
    """A dense run config on GPT-NeoX's MoE checkpoint names both expert counts; a saved config
    with a gated activation (GPT-NeoX's experts would apply it ungated) is refused, naming
    it."""
    from megatron.checkpointing.locate import planned_manifest
    from megatron.preflight import _check_shape

    args = moe_args(paths)
    _, canonical = moe_source(args)
    root = tmp_path / "neox"
    write_neox_checkpoint(root, lambda r: moe_layers(canonical, 4, 2, r), 2, "pipeline",
                          iteration=30, configs={"moe.yml": MOE_CONFIG})
    dense = NeoXArgs.from_ymls(["configs/tiny.yml", paths], ["gpt_j_residual=false"])
    manifest = planned_manifest(root, None)
    with pytest.raises(ValueError, match=r"moe_num_experts: checkpoint 4, this run 1; "
                                         r"moe_expert_interval: checkpoint 2, this run 1"):
        _check_shape(dense, manifest.run, root / manifest.tag)
    _check_shape(args, manifest.run, root / manifest.tag)  # the MoE config it came from loads
    gated = tmp_path / "gated"
    write_neox_checkpoint(gated, lambda r: moe_layers(canonical, 4, 2, r), 2, "pipeline",
                          iteration=30, configs={"moe.yml": MOE_CONFIG | {"activation": "swiglu"}})
    with pytest.raises(CheckpointMismatchError, match=r"activation swiglu.*without a gate"):
        read_checkpoint(gated, run_args=args).canonical
