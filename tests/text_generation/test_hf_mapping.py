"""Our model equals Hugging Face's GPTNeoX, Llama and Mixtral on the same weights: logits, and greedy
generation with and without the KV cache, for single prompts and left-padded batches; the
inverse mapping gives back the same tensors; what neither can hold is refused with the reasons."""

import pytest
import torch

from megatron.model.hf_mapping import architecture_for, canonical_from_hf, hf_config, to_hf_model
from megatron.text_generation.generation import generate
from megatron.text_generation.sampling import SamplingParams
from tests.text_generation.models import small_model

ATOL = 2e-5  # fp32; the two differ only in kernel choice and summation order
HF_VARIANTS = ["neox", "pythia_parallel", "llama_gqa", "mixtral"]
LLAMA_EXTRAS = {"untied": {}, "tied": dict(tied_embeddings=True),
                "geglu_biases": dict(activation="geglu", use_bias_in_attn_linear=True,
                                     use_bias_in_mlp=True)}
EOD = 0


def prompts_of(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("variant", HF_VARIANTS + ["tied_full_rotary"])
def test_logits_equal_hugging_face_gpt_neox(variant):
    extra = dict(tied_embeddings=True, rotary_pct=1.0) if variant == "tied_full_rotary" else {}
    model, weights = small_model("neox" if extra else variant, **extra)
    hf = to_hf_model(weights, model.config)
    tokens = torch.randint(0, 128, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = model.forward(tokens, torch.arange(40).expand(3, 40))
        theirs = hf(tokens).logits
    assert ours.shape == theirs.shape == (3, 40, 128)
    assert (ours - theirs).abs().max().item() < ATOL


@pytest.mark.parametrize("variant", HF_VARIANTS)
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_equals_hugging_face_generate(variant, use_cache):
    model, weights = small_model(variant)
    hf = to_hf_model(weights, model.config, eos_token_id=EOD)
    prompts = prompts_of([7, 3, 12])
    ours = generate(model, prompts, 16, SamplingParams(), frozenset({EOD}), batch_size=3,
                    use_cache=use_cache)
    # HF, batched with left padding and an attention mask
    longest = max(map(len, prompts))
    ids = torch.tensor([[EOD] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                          pad_token_id=EOD, eos_token_id=EOD)
    for g, row in zip(ours, out[:, longest:].tolist()):
        expected = row[:row.index(EOD) + 1] if EOD in row else row
        assert g.ids == expected


@pytest.mark.parametrize("extra", list(LLAMA_EXTRAS))
def test_logits_equal_hugging_face_llama(extra):
    model, weights = small_model("llama_gqa", **LLAMA_EXTRAS[extra])
    hf = to_hf_model(weights, model.config)
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert hf.config.num_key_value_heads == 2
    tokens = torch.randint(0, 128, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = model.forward(tokens, torch.arange(40).expand(3, 40))
        theirs = hf(tokens).logits
    assert (ours - theirs).abs().max().item() < ATOL


@pytest.mark.parametrize("variant", HF_VARIANTS)
def test_hugging_face_weights_map_back_to_the_same_tensors(variant):
    model, weights = small_model(variant)
    hf = to_hf_model(weights, model.config)
    back, config = canonical_from_hf(hf.state_dict(), hf.config)
    assert back.keys() == weights.keys()
    assert all(torch.equal(back[k], weights[k]) for k in weights)
    for name in ("num_kv_heads", "norm", "activation", "rotary_pct", "gpt_j_residual",
                 "tied_embeddings", "use_bias_in_mlp", "norm_epsilon"):
        assert getattr(config, name) == getattr(model.config, name), name


def test_architectures_gpt_neox_cannot_hold_are_refused_with_the_reasons():
    model, _ = small_model("llama_gqa")
    assert architecture_for(model.config) == "llama"
    with pytest.raises(ValueError, match=r"cannot be expressed as Hugging Face GPTNeoX: "
                       r"num_kv_heads 2 != num_attention_heads 4 .*norm 'rmsnorm'.*activation "
                       r"'swiglu'.*use_bias_in_mlp false"):
        hf_config(model.config, architecture="neox")


def test_architectures_no_hugging_face_class_holds_are_refused_with_each_reason():
    model, _ = small_model("alibi_tied")
    with pytest.raises(ValueError, match=r"any Hugging Face architecture we map: GPTNeoX: "
                       r"pos_emb 'alibi' .* \| Llama: pos_emb 'alibi' .*norm 'layernorm'"):
        hf_config(model.config)
    with pytest.raises(ValueError, match=r"Llama: .*rotary_pct 0.25 \(Llama rotates whole heads"):
        hf_config(small_model("neox", num_kv_heads=2)[0].config)


def test_hugging_face_configs_we_cannot_run_are_refused():
    from transformers import LlamaConfig

    hf_cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                         intermediate_size=128, vocab_size=128, hidden_act="gelu_new",
                         rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_type 'linear' .*hidden_act 'gelu_new'"):
        canonical_from_hf({}, hf_cfg)
