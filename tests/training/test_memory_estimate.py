"""The per-worker memory estimate (A30, A31): exact parameter counts against built models, the
refusal deepy.py prints before any worker starts, the tool, and the estimate against the peak
resident memory of real DeepSpeed engines training on CPU."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.model.config import model_config_from_args
from megatron.model.gpt import GPTModel, build_pipeline_model
from megatron.model.kv_cache import kv_cache_bytes
from megatron.model.param_count import balanced_bounds, params_per_rank, uniform_bounds
from megatron.mpu.groups import TensorParallel
from megatron.neox_arguments import NeoXArgs
from megatron.training.memory_check import check_memory
from megatron.training.memory_estimate import GIB, inference_estimate, training_estimate
from tests.distributed import run_distributed
from tests.runs import ROOT, clean_env, deepy, explain, free_port

SMALL = ["hidden_size=64", "num_attention_heads=4", "num_layers=3", "seq_length=32",
         "max_position_embeddings=32"]
VARIANTS = {
    "neox": ["configs/tiny.yml"],  # rotary, gpt-j residual, untied, layernorm with bias, gelu
    "llama": ["configs/tiny_llama.yml"],  # GQA, rmsnorm, swiglu, no biases
    "tied-learned": ["configs/tiny.yml", "no_weight_tying=false", "pos_emb=learned",
                     "use_bias_in_attn_linear=false"],
    "scalenorm-sinusoidal": ["configs/tiny.yml", "norm=scalenorm", "pos_emb=sinusoidal",
                             "activation=geglu", "use_bias_in_mlp=false", "mlp_multiple_of=8"],
    "moe": ["configs/tiny.yml", "configs/tiny_moe.yml"],  # experts in layers 0 and 2
}


def load(files_and_overrides, *extra) -> NeoXArgs:
    files = [f for f in files_and_overrides if f.endswith(".yml")]
    overrides = [o for o in files_and_overrides if not o.endswith(".yml")]
    return NeoXArgs.from_ymls(files, [*SMALL, *overrides, *extra])


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_parameter_count_equals_the_built_model_on_every_tensor_rank(name, tp):
    args = load(VARIANTS[name], f"model_parallel_size={tp}", f"num_gpus={tp}", "num_kv_heads=4")
    config = model_config_from_args(args, padded_vocab_size=1000 // 8 * 8 * tp)
    expected = params_per_rank(config, tp)
    assert len(expected) == 1
    for rank in range(tp):
        model = GPTModel(config, TensorParallel(rank=rank, size=tp))
        assert sum(p.numel() for p in model.parameters()) == expected[0], (name, tp, rank)


@pytest.mark.parametrize("tp,ep", [(1, 2), (2, 2), (1, 4)])
def test_parameter_count_with_expert_parallelism_equals_the_built_model(tp, ep):
    """Each rank of tensor rank t, expert rank q builds its 4 / (tp ep) experts; the estimate's
    count of expert weights on the rank agrees."""
    from megatron.model.param_count import expert_params, expert_params_per_rank
    from megatron.mpu.groups import ExpertParallel

    args = load(VARIANTS["moe"], f"model_parallel_size={tp}", f"num_gpus={tp * ep}",
                f"moe_expert_parallel_size={ep}", "num_kv_heads=4", "train_batch_size=32")
    config = model_config_from_args(args, padded_vocab_size=1000 // 8 * 8 * tp)
    expected = params_per_rank(config, tp, ep=ep)[0]
    for rank in range(tp):
        for q in range(ep):
            view = TensorParallel(rank=rank, size=tp, ep=ExpertParallel(rank=q, size=ep))
            model = GPTModel(config, view)
            assert sum(p.numel() for p in model.parameters()) == expected, (tp, ep, rank, q)
            held = sum(p.numel() for p in model.parameters() if getattr(p, "expert_parallel", 0))
            everything = range(config.num_layers + 3)
            assert held == expert_params_per_rank(config, everything, tp, ep)
            assert held == 2 * (4 // (tp * ep)) * expert_params(config)  # two MoE layers
    estimate = training_estimate(args, 1000 // 8 * 8 * tp)
    assert estimate.layout.ep == ep and f"ep={ep}" in estimate.layout.describe()


def _stage_params(rank: int, world: int, config, pp: int, methods):
    import deepspeed

    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.initialize import disable_deepspeed_shm_allreduce
    from megatron.mpu.topology import Topology

    disable_deepspeed_shm_allreduce()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    topology = Topology.from_world(world, 1, pp)
    tp = ProcessGroups.build(topology).tensor_parallel(1234)
    out = {}
    for method in methods:
        module = build_pipeline_model(config, topology.deepspeed_topology(), method, None, tp)
        out[method] = sum(p.numel() for p in module.parameters())
    return out


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_per_pipeline_stage_equals_deepspeeds_partition(tied):
    args = load(["configs/tiny.yml", f"no_weight_tying={str(not tied).lower()}",
                 "pos_emb=learned"], "num_layers=5", "pipe_parallel_size=2", "num_gpus=2")
    config = model_config_from_args(args, padded_vocab_size=1024)
    methods = ["type:transformer|mlp", "parameters", "uniform"]
    measured = run_distributed(_stage_params, 2, config, 2, methods)
    for method in methods:
        assert [m[method] for m in measured] == params_per_rank(config, 1, 2, method), method


def test_stage_boundaries_are_deepspeeds_for_any_weights():
    """deepy.py partitions the layers without importing DeepSpeed (and torch); it must choose
    DeepSpeed's stages, ties included: zero/one weights as type:<regex> gives, parameter counts,
    repeated values, more stages than layers."""
    from deepspeed.runtime import utils as ds_utils

    rng = random.Random(0)
    for trial in range(600):
        n, parts = rng.randint(1, 24), rng.randint(1, 8)
        weights = [[rng.randint(0, 1) for _ in range(n)],
                   [rng.randint(1, 10**9) for _ in range(n)],
                   [rng.choice([0, 5, 5, 7]) for _ in range(n)]][trial % 3]
        assert balanced_bounds(weights, parts) == [
            int(b) for b in ds_utils.partition_balanced(weights=weights, num_parts=parts)], weights
        assert uniform_bounds(n, parts) == ds_utils.partition_uniform(num_items=n,
                                                                      num_parts=parts)


def test_full_size_count_is_pythias_6_9b():
    """configs/6-7B.yml with GPT-2's tokenizer at tp=1 pads to 50304 rows; Pythia-6.9B (same
    shape, 50432 rows) has 6,857,302,016 parameters: 2 * 128 * 4096 more."""
    args = NeoXArgs.from_ymls(["configs/6-7B.yml"], ["num_gpus=1"])
    config = model_config_from_args(args, padded_vocab_size=50304)
    assert params_per_rank(config)[0] == 6_857_302_016 - 2 * 128 * 4096


def test_zero_stages_split_what_they_partition():
    base = ["configs/tiny.yml", "num_gpus=4", "pipe_parallel_size=0", "train_batch_size=32"]
    est = {z: training_estimate(load(base, f"zero_optimization={{stage: {z}}}"), 1024)
           for z in (0, 1, 2, 3)}
    full = est[0].params * 4
    assert est[0].term("optimizer states") == 2 * full and est[0].term("fp32 master copy") == 0
    assert est[1].term("optimizer states") == 2 * full // 4
    assert est[1].term("fp32 master copy") == 2 * full // 4 and est[1].term("gradients") == full
    assert est[2].term("gradients") == full // 4 and est[2].term("weights") == full
    assert est[3].term("weights") == full // 4


BUCKET = 1_234_566  # reduce_bucket_size: no other tensor of the step has this many elements
BUCKET_LAYOUTS = {  # name: overrides of the engine test model, one rank
    "pipeline ZeRO 1": {"zero_optimization": {"stage": 1}},
    "pipeline ZeRO 1 bf16": {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}},
    "plain ZeRO 1": {"pipe_parallel_size": 0, "zero_optimization": {"stage": 1}},
    "plain ZeRO 1 overlap_comm": {"pipe_parallel_size": 0,
                                  "zero_optimization": {"stage": 1, "overlap_comm": True}},
    "plain ZeRO 2 overlap_comm": {"pipe_parallel_size": 0,
                                  "zero_optimization": {"stage": 2, "overlap_comm": True}},
    "no contiguous_gradients": {"zero_optimization": {"stage": 1,
                                                      "contiguous_gradients": False}},
    "bf16 optimizer": {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
                       "data_types": {"grad_accum_dtype": "fp32"}},
    "ZeRO 0": {},
}


def bucket_peaks(rank: int, world: int, tmp: str) -> dict:
    """For each layout: (the most bytes of reduce_bucket_size buffers alive at once during
    two steps of a real engine, the estimate's term for a GPU, which counts them whole)."""
    import weakref

    from megatron.training.memory_estimate import Layout, zero_bucket_bytes
    from megatron.training.step import train_step
    from tests.checkpointing import engines

    out, empty = {}, torch.empty
    for name, overrides in BUCKET_LAYOUTS.items():
        zero = {**overrides.get("zero_optimization", {}), "reduce_bucket_size": BUCKET}
        args = engines.make_args(Path(tmp) / name, **{**overrides, "zero_optimization": zero})
        engine = engines.build(args)
        alive, peak = [0], [0]

        def recording(*a, **k):
            t = empty(*a, **k)
            if t.numel() == BUCKET:
                size = t.numel() * t.element_size()
                alive[0] += size
                peak[0] = max(peak[0], alive[0])
                weakref.finalize(t, lambda n=size: alive.__setitem__(0, alive[0] - n))
            return t

        torch.empty = recording
        try:
            engines.train(engine, args, 2)
        finally:
            torch.empty = empty
        params = sum(p.numel() for p in engine.engine.module.parameters())
        out[name] = (peak[0], zero_bucket_bytes(args, Layout.from_args(args), "cuda", params),
                     zero_bucket_bytes(args, Layout.from_args(args), "cpu", params), params)
    return out


def test_bf16_with_fp32_accumulation_has_buckets_only_with_optimizer_offload():
    """DeepSpeed runs its bf16 optimizer (no buckets) for bf16 + fp32 accumulation under ZeRO
    1, unless the optimizer is offloaded: then its ZeRO optimizer, with fp32 buckets."""
    base = ["configs/tiny.yml", "bf16={enabled: true}", "data_types={grad_accum_dtype: fp32}"]
    plain = training_estimate(load(base, "zero_optimization={stage: 1}"), 1024, device="cuda")
    offload = training_estimate(load(base, "zero_optimization={stage: 1, offload_optimizer: "
                                           "{device: cpu}}"), 1024, device="cuda")
    assert plain.term("ZeRO gradient buckets") == 0
    assert offload.term("ZeRO gradient buckets") == 2 * 500_000_000 * 4  # pipeline engine


def test_zero_gradient_buckets_are_the_buffers_deepspeed_allocates(tmp_path):
    """The term counts the buffers of reduce_bucket_size elements DeepSpeed's ZeRO optimizer
    allocates in a real step, whole on a GPU: one, two with overlap_comm, two under the
    pipeline engine, in the run's dtype; none without contiguous_gradients, under DeepSpeed's
    bf16 optimizer or without ZeRO. On a CPU each counts only the pages the gradients fill."""
    [found] = run_distributed(bucket_peaks, 1, str(tmp_path))
    expected_buffers = {"pipeline ZeRO 1": (2, 4), "pipeline ZeRO 1 bf16": (2, 2),
                        "plain ZeRO 1": (1, 4), "plain ZeRO 1 overlap_comm": (2, 4),
                        "plain ZeRO 2 overlap_comm": (2, 4), "no contiguous_gradients": (0, 4),
                        "bf16 optimizer": (0, 2), "ZeRO 0": (0, 4)}
    for name, (count, size) in expected_buffers.items():
        peak, term_cuda, term_cpu, params = found[name]
        assert peak == term_cuda == count * BUCKET * size, (name, found[name])
        assert term_cpu == count * min(BUCKET, params) * size, (name, found[name])


def test_checkpointing_keeps_layer_inputs_only():
    plain = training_estimate(load(["configs/tiny.yml"]), 1024).term("activations")
    ckpt = training_estimate(load(["configs/tiny.yml"], "checkpoint_activations=true"), 1024)
    mb, s, h, layers = 8, 32, 64, 3
    per_layer = plain // layers
    assert ckpt.term("activations") == layers * mb * s * h * 4 + per_layer


def test_blocked_cpu_attention_adds_the_probabilities_it_keeps():
    """Plain causal attention on a CPU runs through the blocked kernel, which keeps its causal
    blocks of probabilities in the dtype of q, k and v (the kernel's own test counts the same
    tensors): bf16 with native bf16 products, fp32 in fp32 runs and where bf16 products run as
    fp32. ALiBi and attention dropout take SDPA, which keeps a log-sum-exp or the full scores."""
    from megatron.model.cpu_attention_blocks import kept_probabilities

    def activations(*extra, bf16=True):
        args = load(["configs/tiny.yml"], *(["bf16={enabled: true}"] if bf16 else []), *extra)
        return training_estimate(args, 1024, device="cpu").term("activations")

    fp32_products = activations("cpu_matmul_precision=fp32")
    native = activations("cpu_matmul_precision=native")
    mb, heads, layers, s = 8, 4, 3, 32
    lse = mb * heads * s * 4  # what the fused kernels' log-sum-exp is counted as
    fp32_qkv = mb * s * (2 * 64 + 2 * 64) * 2  # q, k, v and output in fp32 instead of bf16
    kept = mb * heads * kept_probabilities(s)
    assert native - (fp32_products - layers * fp32_qkv) == layers * (kept * 2 - kept * 4)
    assert kept_probabilities(s) == 32 * 32 and kept_probabilities(512) == 512 * 576 // 2
    assert native - activations("cpu_matmul_precision=native", "pos_emb=alibi") == layers * (
        kept * 2 - lse)
    fp32 = activations(bf16=False)
    assert fp32 - activations("pos_emb=alibi", bf16=False) == layers * (kept * 4 - lse)
    with_dropout = activations("cpu_matmul_precision=native", "attention_dropout=0.1")
    assert with_dropout > native  # the math kernel's fp32 [s, s] scores


# the shipped post-training configs on configs/tiny.yml; tiny_sft.yml is a plain (normal) run
POST_TRAINING = {impl: ["configs/tiny.yml", f"configs/post-training/tiny_{name}.yml"]
                 for impl, name in (("normal", "sft"), ("dpo", "dpo"), ("kto", "kto"),
                                    ("rm", "rm"))}


def pair_batch(pairs: int, s: int, vocab: int) -> dict:
    """A loader batch of `pairs` chosen/rejected pairs (dataset_impl pairwise), one document
    a row, the first half of each row prompt (label -100)."""
    gen = torch.Generator().manual_seed(0)
    batch = {}
    for side in ("pos", "neg"):
        tokens = torch.randint(0, vocab, (pairs, s + 1), generator=gen)
        label = tokens.clone()
        label[:, : s // 2] = -100
        batch.update({side: tokens, f"{side}_label": label,
                      f"{side}_segment": torch.zeros_like(tokens)})
    return batch


def frozen_copies(args, config, tp: int = 1, ep: int = 1) -> list:
    """The reference model train.py builds on every tensor (and expert) rank: the run's model
    read from the full weights, with this rank's shard, in the run's dtype, frozen
    (megatron/training/reference.py)."""
    from megatron.model.partition import canonical_from_module
    from megatron.mpu.groups import ExpertParallel
    from megatron.training.reference import ReferenceModel, _build_model

    full = canonical_from_module(GPTModel(config, TensorParallel()).state_dict())
    views = [TensorParallel(rank=r, size=tp, ep=ExpertParallel(rank=q, size=ep))
             for r in range(tp) for q in range(ep)]
    return [ReferenceModel(_build_model(args, config, view, full), view, {}) for view in views]


def held_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def vocab_columns(module) -> int:
    """The logits one position gets on this rank: the rows of the model's LM head."""
    from megatron.model.gpt import LMHead

    return next(m for m in module.modules() if isinstance(m, LMHead)).weight.shape[0]


REFERENCE_LAYOUTS = {  # name: overrides of configs/post-training/tiny_dpo.yml, SMALL shape
    "tp1 fp32": ["num_gpus=1"],
    "tp1 bf16": ["num_gpus=1", "bf16={enabled: true}"],
    "tp2": ["num_gpus=2", "model_parallel_size=2"],
    "pp2": ["num_gpus=2", "pipe_parallel_size=2"],  # the last stage holds the whole reference
    "ep2 experts": ["configs/tiny_moe.yml", "num_gpus=2", "moe_expert_parallel_size=2",
                    "num_kv_heads=4", "train_batch_size=32"],
}


@pytest.mark.parametrize("name", sorted(REFERENCE_LAYOUTS))
def test_dpo_reference_term_is_the_frozen_copy_train_py_builds(name):
    """docs/posttraining.md: the estimate counts DPO's reference model: on every rank, the
    bytes of the frozen model train.py builds there (its tensor shard and, under expert
    parallelism, its own experts, in the run's dtype; whole on the last pipeline stage), plus
    the fp32 logits of its forward pass over the micro-batch's chosen and rejected rows."""
    from megatron.training.objectives import build_objective
    from megatron.training.objectives.common import BatchOptions

    args = load([*POST_TRAINING["dpo"], *REFERENCE_LAYOUTS[name]])
    tp, ep = args.parallelism.model_parallel_size, args.parallelism.moe_expert_parallel_size
    config = model_config_from_args(args, 1024)
    est = training_estimate(args, 1024)
    copies = frozen_copies(args, config, tp, ep)
    model = copies[0].model
    assert len({held_bytes(c.model) for c in copies}) == 1  # every rank holds the same amount
    mb = args.derived.train_micro_batch_size_per_gpu
    inputs, targets = build_objective(args).prepare(pair_batch(mb, 32, 1000), BatchOptions(0))
    rows, s = inputs[0].shape
    assert (rows, s) == (2 * mb, 32)  # chosen rows, then rejected rows
    logits = rows * s * vocab_columns(model) * 4
    assert est.term("reference model") == held_bytes(model) + logits > 0
    if tp == ep == 1:  # the forward the reference runs on every micro-batch
        assert model(*inputs).shape == (rows, s, vocab_columns(model))
        _, filled = copies[0].fill(build_objective(args), inputs, targets)
        assert filled[3].shape == (rows, s) and filled[3].abs().sum() > 0
    if name == "pp2":  # the last stage holds half the layers, and the whole reference
        assert est.stage == 1 and est.params < sum(p.numel() for p in model.parameters())


def test_only_dpo_and_kto_hold_a_reference_model():
    """KTO compares with a reference too, one row per sample: half DPO's logits for the same
    weights. A plain run, a reward model (pairs, no reference) and reference-free DPO hold
    none, as their objectives ask for none (train.py builds a reference exactly when
    `needs_reference`)."""
    from megatron.training.objectives import build_objective

    def reference(impl, *extra):
        args = load(POST_TRAINING[impl], *extra)
        return build_objective(args).needs_reference, training_estimate(args, 1024).term(
            "reference model")

    dpo_args = load(POST_TRAINING["dpo"])
    weights = held_bytes(frozen_copies(dpo_args, model_config_from_args(dpo_args, 1024))[0].model)
    dpo, kto = reference("dpo"), reference("kto")
    assert dpo[0] and kto[0]
    assert kto[1] - weights == (dpo[1] - weights) // 2 == 8 * 32 * 1024 * 4
    for impl, extra in (("normal", []), ("rm", []), ("dpo", ["dpo_reference_free=true"])):
        assert reference(impl, *extra) == (False, 0), (impl, extra)


@pytest.mark.parametrize("impl", ["dpo", "rm"])
def test_pairs_put_twice_the_micro_batch_through_the_model(impl):
    """A micro-batch of b pairs is 2b rows through the model (the objective's own batch): its
    activations, backward working set and logits are those of a plain run at micro-batch 2b,
    twice those at b; a reward model's value head keeps one fp32 value per position of every
    row, its gradient and the loss's. KTO (no pairs) keeps a plain run's."""
    from megatron.training.objectives import build_objective
    from megatron.training.objectives.common import BatchOptions

    def estimate(which, mb):
        return training_estimate(load(POST_TRAINING[which], f"train_micro_batch_size_per_gpu={mb}",
                                      f"train_batch_size={2 * mb}"), 1024)

    pairs, plain, doubled = estimate(impl, 4), estimate("normal", 4), estimate("normal", 8)
    args = load(POST_TRAINING[impl], "train_micro_batch_size_per_gpu=4", "train_batch_size=8")
    inputs, _ = build_objective(args).prepare(pair_batch(4, 32, 1000), BatchOptions(0))
    assert tuple(inputs[0].shape) == (8, 32)
    per_row = ["activations", "backward working set"]
    for term in per_row + (["logits and loss"] if impl == "dpo" else []):
        assert pairs.term(term) == doubled.term(term) == 2 * plain.term(term) > 0, term
    if impl == "rm":
        config = model_config_from_args(args, 1024)
        values = GPTModel(config, TensorParallel())(*inputs)
        assert pairs.term("logits and loss") == 3 * values.numel() * 4 and values.shape == (8, 32)
    kto = estimate("kto", 4)
    assert [kto.term(t) for t in per_row] == [plain.term(t) for t in per_row]


def test_dpo_estimate_shows_its_reference_model_before_launch(caplog, capsys):
    """What deepy.py logs before the workers start, and what tools/memory_estimate.py prints,
    for the shipped DPO config: the reference model as its own term, the frozen model's bytes
    and its fp32 logits (16 rows of 64 positions of 8192 columns); a plain run shows none."""
    import importlib.util

    from megatron.training.memory_estimate import gib

    dpo = NeoXArgs.from_ymls(POST_TRAINING["dpo"], ["num_gpus=1"])
    expected = (held_bytes(frozen_copies(dpo, model_config_from_args(dpo, 8192))[0].model)
                + 16 * 64 * 8192 * 4)
    with caplog.at_level(logging.INFO, logger="megatron"):
        check_memory(dpo, "train.py", 8192, 1, "cpu", (1024 * GIB, "a stated figure"))
        check_memory(NeoXArgs.from_ymls(POST_TRAINING["normal"], ["num_gpus=1"]), "train.py",
                     8192, 1, "cpu", (1024 * GIB, "a stated figure"))
    dpo_line, plain_line = [r.getMessage() for r in caplog.records
                            if r.getMessage().startswith("memory estimate for train.py")]
    assert f", reference model {gib(expected)}" in dpo_line, dpo_line
    assert "reference model" not in plain_line, plain_line
    spec = importlib.util.spec_from_file_location("memory_estimate",
                                                  ROOT / "tools/memory_estimate.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([*POST_TRAINING["dpo"], "--vocab-size", "8192", "--device", "cpu",
                      "num_gpus=1"]) in (0, 1)
    out = capsys.readouterr().out.splitlines()
    assert [line.split() for line in out if line.startswith("  reference model ")] == [
        ["reference", "model", f"{expected / GIB:.3f}", "GiB"]], out


def test_generation_needs_weights_and_the_kv_cache_of_a29():
    args = load(["configs/tiny.yml"], "generation_batch_size=3")
    est = inference_estimate(args, 1024, tp=1, device="cpu", dtype_bytes=4)
    config = model_config_from_args(args, 1024)
    assert est.term("KV cache") == kv_cache_bytes(3, 3, 32, 4, 16, torch.float32)
    assert est.term("weights") == params_per_rank(config)[0] * 4
    assert "optimizer states" not in dict(est.terms)
    no_cache = inference_estimate(load(["configs/tiny.yml"], "recompute=true"), 1024, 1, "cpu", 4)
    assert no_cache.term("KV cache") == 0


def test_memory_check_refuses_warns_or_skips(caplog):
    available = (GIB // 100, "a stated figure")
    big = ["seq_length=2048", "max_position_embeddings=2048", "train_micro_batch_size_per_gpu=64",
           "train_batch_size=128"]
    with pytest.raises(RuntimeError) as err:
        check_memory(load(["configs/tiny.yml"], *big), "train.py", 1024, 2, "cpu", available)
    text = str(err.value)
    assert text.startswith("the model needs ~") and "per worker (" in text
    assert "but this machine has 0.01 GiB available for 2 worker(s) (a stated figure)" in text
    assert "the biggest term is activations: set checkpoint_activations: true" in text
    # on CPU the workers share the machine's memory: fewer have more each
    assert "; or start fewer than 2 workers (num_gpus): they share this machine's memory" in text
    with caplog.at_level(logging.WARNING, logger="megatron"):
        check_memory(load(["configs/tiny.yml"], *big, "memory_check=warn"), "train.py", 1024, 2,
                     "cpu", available)
    assert any("the model needs ~" in r.getMessage() for r in caplog.records)
    est = check_memory(load(["configs/tiny.yml"], *big, "memory_check=false"), "train.py", 1024,
                       2, "cpu", available)
    assert est.total > GIB // 100


def test_with_a_hostfile_the_estimate_is_logged_not_compared(caplog, tmp_path):
    """The workers run on the hostfile's hosts, whose memory this machine cannot see."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=2\nn1 slots=2\n")
    big = ["seq_length=2048", "max_position_embeddings=2048", "train_micro_batch_size_per_gpu=64",
           "train_batch_size=null", "gradient_accumulation_steps=1", f"hostfile={hostfile}"]
    with caplog.at_level(logging.INFO, logger="megatron"):
        est = check_memory(load(["configs/tiny.yml"], *big), "train.py", 1024, 2, "cpu",
                           (GIB // 100, "a stated figure"))
    assert est.total > GIB // 100
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("memory estimate for train.py (") for m in said), said
    assert "memory estimate not compared: the workers run on the hostfile's hosts" in said


def test_deepy_refuses_the_6_7b_config_before_any_worker_starts(small_data, tmp_path):
    prefix, tokenizer = small_data
    proc = deepy("train.py", "configs/6-7B.yml", f"data_path={prefix}", f"vocab_file={tokenizer}",
                 "tokenizer_type=HFTokenizer", "num_gpus=1", "distributed_backend=gloo",
                 "fp16={enabled: false}", "bf16={enabled: true}", f"save={tmp_path / 'ckpt'}",
                 # splits of the small data that hold a batch of 2048-token samples each
                 "split=900,50,50", f"master_port={free_port()}", timeout=120, env=clean_env())
    assert proc.returncode == 1, explain(proc)
    err = proc.stderr
    assert "memory estimate for train.py (tp=1 pp=1 dp=1 ZeRO 1, cpu): ~" in err, explain(proc)
    line = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(line) == 1 and line[0].startswith("error: the model needs ~"), explain(proc)
    assert "available for 1 worker(s) (MemAvailable" in line[0]
    assert "the biggest term is fp32 master copy" in line[0] and "memory_check: warn" in line[0]
    assert "launching" not in err and not (tmp_path / "ckpt").exists()


def test_tool_prints_what_docs_memory_md_shows_for_its_example():
    """docs/memory.md's example command (a GPU layout, --device cuda), run as written, prints the
    page's output, every line but the machine's own ("available"; the exit status follows it),
    whatever this machine's CPU."""
    import shlex

    from tests.docs.blocks import DOCS, blocks

    page = blocks(DOCS / "memory.md")
    at = next(i for i, b in enumerate(page) if "memory_estimate.py configs/6-7B.yml" in b.text)
    command, shown = page[at].text.replace("\\\n", " "), page[at + 1].text.splitlines()
    argv = shlex.split(command)
    assert argv[:2] == ["python", "tools/memory_estimate.py"], command
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout.splitlines()
    assert len(out) == len(shown) and out[-1].startswith("  available"), proc.stderr
    assert out[:-1] == shown[:-1], f"docs/memory.md:{page[at + 1].line} differs from the tool"
    assert proc.returncode == (1 if out[-1].endswith(": does not fit") else 0)


def test_tool_takes_another_world_size_script_and_device(capsys):
    """--world-size sets the ranks, --script the inference estimate (tensor parallelism only),
    --device cuda on a machine without CUDA prints the estimate uncompared and exits 0."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("memory_estimate",
                                                  ROOT / "tools/memory_estimate.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    base = ["configs/tiny.yml", "--vocab-size", "8192", "--device", "cpu"]
    assert tool.main([*base, "--world-size", "4", "model_parallel_size=2"]) in (0, 1)
    assert "  layout: tp=2 pp=1 dp=2 ZeRO 0 (world size 4), fp32, cpu\n" in capsys.readouterr().out
    assert tool.main([*base, "--script", "generate.py"]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith("memory estimate for generate.py, per worker") and \
        "  layout: tp=1 (world size 2), fp32, cpu\n" in out and "optimizer states" not in out
    for flag in ("--world-size", "--vocab-size"):
        with pytest.raises(SystemExit):  # argparse's usage error, exit status 2
            tool.main([*base, flag, "0"])
        assert f"argument {flag}: 0 is not at least 1" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert tool.main(["configs/tiny.yml", "--vocab-size", "8192", "--device", "cuda",
                          "--script", "eval.py"]) == 0
        assert capsys.readouterr().out.endswith(
            "  available: not compared (this machine has no CUDA GPU)\n")


MEASURED = {  # name: overrides on configs/tiny.yml (27.3M parameters, sequences of 256)
    "fp32 ZeRO 0": [],
    "fp32 ZeRO 1 checkpointed": ["zero_optimization={stage: 1}", "checkpoint_activations=true"],
    "bf16 ZeRO 1": ["zero_optimization={stage: 1}", "bf16={enabled: true}"],
    "fp32 ZeRO 0 experts": ["moe_num_experts=4", "moe_top_k=2", "moe_expert_interval=2"],
    # configs/tiny_mamba.yml's layer pattern twice: 6 Mamba layers (chunked scan), 2 attention
    "fp32 ZeRO 0 mamba": ["attention_config=[[[mamba, mamba, global, mamba], 2]]",
                          "mamba_selective_scan_fusion=true"],
    # configs/post-training/tiny_dpo.yml, 2 pairs a micro-batch: the others' 4 rows of 256
    # tokens through the model, plus the frozen reference model, read as train.py reads it from
    # the checkpoint the run starts from (STARTS_FROM_A_CHECKPOINT)
    "fp32 ZeRO 0 dpo": ["configs/post-training/tiny_dpo.yml", "data_path=null",
                        "train_micro_batch_size_per_gpu=2", "train_batch_size=2"],
}
# cases whose run fine-tunes a checkpoint of the same model, written first by the worker's
# `save` mode (about 10 s more than a case without)
STARTS_FROM_A_CHECKPOINT = {"fp32 ZeRO 0 dpo"}


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_estimate_is_within_tolerance_of_measured_peak_rss(name, small_data, tmp_path):
    """On a real engine doing 3 steps, set up as train.py's CPU workers are (freed memory kept
    by the process, megatron/training/host_memory.py): the whole estimate, which the memory
    check compares with what the machine has, against the worker's peak RSS; and the model
    terms (all but the framework constant) against the growth of peak RSS over the baseline of
    a worker with no model. Measured (docs/memory.md): the whole estimate 1.03 (ZeRO 1,
    checkpointed) to 1.20 (fp32 ZeRO 0) of the peak; the model terms 0.67 to 0.84 of the
    growth, the rest being freed memory the heap keeps between differently sized tensors. With
    other processes busy on the cores the peak moves more (how the threads' allocations fall
    into glibc's arenas): the ZeRO 1 checkpointed peak from 1.46 to 1.93 GiB, the estimate 0.89
    to 1.19 of it, the model terms 0.57 of the growth at the highest; the bounds allow that.
    DPO (2 pairs, its reference model 112 MiB, read from a checkpoint) peaked 72 to 131 MiB
    above the plain run at 1385 to 1450 MiB: the estimate 1.15 to 1.20 of the peak, the model
    terms 0.75 to 0.80 of the growth."""
    prefix, tokenizer = small_data
    argv = ["configs/tiny.yml", f"data_path={prefix}", f"vocab_file={tokenizer}", "num_gpus=1",
            "hidden_size=512", "num_layers=8", "num_attention_heads=8", "seq_length=256",
            "max_position_embeddings=256", "train_micro_batch_size_per_gpu=4",
            "train_batch_size=4", f"save={tmp_path / 'run'}", "load=null"]

    def worker(mode: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tests.training.memory_worker", mode, *argv,
                               f"master_port={free_port()}", *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=600,
                              env=clean_env(OMP_NUM_THREADS="2"))

    start = []
    if name in STARTS_FROM_A_CHECKPOINT:
        saved = worker("save", f"save={tmp_path / 'start'}", "no_save_optim=true")
        assert saved.returncode == 0, explain(saved)
        start = [f"load={tmp_path / 'start'}"]  # fine-tuned (finetune: true), the reference
    proc = worker("3", *MEASURED[name], *start)
    assert proc.returncode == 0, explain(proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["params"] == result["estimate_params"]
    assert result["reference"] == (result["terms"]["reference model"] > 0), result
    total = sum(result["terms"].values())
    assert 0.80 * result["peak"] <= total <= 1.35 * result["peak"], (name, total, result)
    estimate = total - result["terms"]["framework"]
    growth = result["peak"] - result["baseline"]
    assert 0.50 * growth <= estimate <= 1.05 * growth, (name, estimate, growth)
    assert result["baseline"] <= result["terms"]["framework"]
