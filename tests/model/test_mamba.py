"""Mamba layers (megatron/model/mamba.py): GPT-NeoX's initialisation, the chunked scan equal to
the reference inside the model, and Hugging Face's MambaForCausalLM on the same weights (logits
both ways, tensors bit for bit)."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel, lm_loss
from megatron.model.hf_mapping import architecture_for, canonical_from_hf, to_hf_model
from megatron.model.mamba import MambaMixer, STATE_SIZE
from megatron.model.partition import canonical_from_module
from megatron.text_generation.inference_model import InferenceModel

ATOL = 2e-5  # fp32, different summation order only


def config(**overrides) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                intermediate_size=128, seq_length=40, max_position_embeddings=40,
                padded_vocab_size=128, attention_types=("mamba", "mamba"), mamba_inner_size=128,
                norm="rmsnorm", use_bias_in_norms=False, pos_emb="none", tied_embeddings=True,
                init_method="small_init", output_layer_init_method="single_residual_scaled_normal",
                mamba_selective_scan_fusion=True)
    base.update(overrides)
    return ModelConfig(**base)


def test_gpt_neox_initialisation():
    """A_log = log(1..16) in every channel, D = 1, dt_proj's bias the inverse softplus of a
    step in [0.001, 0.1], out_proj N(0, 0.02 / sqrt(layers)) (single_residual_scaled_normal),
    in_proj N(0, sqrt(2 / (5 h))) (small_init)."""
    c = config(num_layers=4, attention_types=("mamba",) * 4, hidden_size=256,
               mamba_inner_size=512)
    layer = GPTModel(c).layers[1].mixer
    assert isinstance(layer, MambaMixer)
    assert torch.allclose(layer.A_log, torch.log(torch.arange(1, STATE_SIZE + 1.0)).expand(512, -1))
    assert torch.equal(layer.D, torch.ones(512))
    dt = torch.nn.functional.softplus(layer.dt_proj.bias)
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 0.1 * 1.001
    assert layer.out_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.05)
    assert layer.in_proj.weight.std().item() == pytest.approx(math.sqrt(2 / (5 * 256)), rel=0.05)
    assert layer.dt_proj.weight.abs().max() <= 16 ** -0.5  # dt_rank ceil(256 / 16)


def test_chunked_scan_equals_the_reference_in_the_model():
    """mamba_selective_scan_fusion picks the chunked scan on CPU; logits, loss and every
    gradient equal the step-by-step reference's."""
    tokens = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(0))
    labels = torch.roll(tokens, -1, 1)
    out = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = GPTModel(config(mamba_selective_scan_fusion=fused))
        logits = model(tokens, torch.arange(40).expand(2, 40))
        loss = lm_loss(logits, (labels, torch.ones(2, 40)))
        loss.backward()
        out[fused] = (logits.detach(), {n: p.grad for n, p in model.named_parameters()})
    assert (out[True][0] - out[False][0]).abs().max() < ATOL
    for name, grad in out[False][1].items():
        assert torch.allclose(out[True][1][name], grad, atol=ATOL), name


@pytest.mark.parametrize("keep", [True, False])
def test_a_bf16_model_keeps_a_and_d_in_fp32_as_mamba_selective_fp32_params_says(keep):
    """Loaded for generation in bf16 (InferenceModel): A_log and D stay fp32 unless the key is
    false; everything else is bf16; the logits follow the fp32 model's."""
    from megatron.model.precision import kept_in_fp32
    from megatron.training.optimizers import build_optimizer

    c = config(mamba_selective_fp32_params=keep)
    torch.manual_seed(0)
    canonical = canonical_from_module(GPTModel(c).state_dict())
    canonical["1.mixer.A_log"] += 1e-3  # a value bf16 cannot hold
    model = InferenceModel.from_canonical(c, canonical, dtype=torch.bfloat16)
    mixer = model.model.layers[1].mixer
    want = torch.float32 if keep else torch.bfloat16
    assert (mixer.A_log.dtype, mixer.D.dtype, mixer.in_proj.weight.dtype) == (
        want, want, torch.bfloat16)
    if keep:
        assert torch.equal(mixer.A_log, canonical["1.mixer.A_log"])
    assert len(kept_in_fp32(model.model)) == (4 if keep else 0)
    # as in GPT-NeoX, A_log (a matrix) and D are not decayed
    groups = build_optimizer(model.model, "adamw", {}, 0.1).param_groups
    no_decay = [p for g in groups if g["weight_decay"] == 0.0 for p in g["params"]]
    assert any(p is mixer.A_log for p in no_decay) and any(p is mixer.D for p in no_decay)
    assert not any(p is mixer.in_proj.weight for p in no_decay)
    if keep:  # a group of their own, after the others
        assert {id(p) for p in groups[-1]["params"]} == {id(p) for p in kept_in_fp32(model.model)}
    reference = InferenceModel.from_canonical(c, canonical)
    tokens = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = model.forward(tokens, torch.arange(40).expand(2, 40)).float()
        exact = reference.forward(tokens, torch.arange(40).expand(2, 40))
    assert (got - exact).abs().max() < 0.1 * exact.abs().max()


def _hf_model(seed: int = 0, **overrides):
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    cfg = MambaConfig(vocab_size=128, hidden_size=64, state_size=16, num_hidden_layers=2,
                      expand=2, conv_kernel=4, use_bias=False, use_conv_bias=True,
                      residual_in_fp32=False, layer_norm_epsilon=1e-5, **overrides)
    model = MambaForCausalLM(cfg).eval()
    with torch.no_grad():  # HF zero-initialises some tensors: make every one count
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape))
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_hugging_face_mamba_both_ways(tied):
    hf = _hf_model(tie_word_embeddings=tied)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    if tied:
        state.pop("lm_head.weight", None)
    canonical, c = canonical_from_hf(state, hf.config)
    assert c.attention_types == ("mamba", "mamba") and c.mamba_inner_size == 128
    assert c.tied_embeddings == tied
    ours = InferenceModel.from_canonical(c, canonical)
    tokens = torch.randint(0, 128, (3, 33), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = ours.forward(tokens, torch.arange(33).expand(3, 33))
        want = hf(tokens).logits
    assert got.shape == want.shape == (3, 33, 128)
    assert (got - want).abs().max().item() < ATOL
    # and back: our weights as HF's Mamba give HF the same logits and tensors
    assert architecture_for(c) == "mamba"
    back = to_hf_model(canonical, c)
    with torch.inference_mode():
        again = back(tokens).logits
    assert torch.equal(again, want)
    theirs = hf.state_dict()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def test_what_hugging_face_mamba_cannot_hold_is_refused_with_the_reasons():
    with pytest.raises(ValueError) as e:
        architecture_for(config(pos_emb="learned", mamba_use_bias_in_linears=True), "mamba")
    assert "pos_emb 'learned' (Mamba has no position embedding: train with pos_emb none)" \
        in str(e.value)
    assert "mamba_use_bias_in_linears true (Mamba's x_proj has no bias)" in str(e.value)
    with pytest.raises(ValueError, match=r"attention types \['global', 'mamba'\] \(Mamba: mamba "
                                         r"layers only\)"):
        architecture_for(config(attention_types=("mamba", "global")), "mamba")
    with pytest.raises(ValueError, match=r"attention types \['mamba'\] \(GPTNeoX: global only"):
        architecture_for(config(pos_emb="rotary"), "neox")
