"""The GPT model: shapes, loss at init, weight tying, deterministic init, architecture options."""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron.model.attention_impls import reference_attention, sdpa_attention
from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel, lm_loss


def config(**overrides) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                intermediate_size=256, seq_length=16, max_position_embeddings=32,
                padded_vocab_size=128, init_method="normal", output_layer_init_method="scaled_normal")
    base.update(overrides)
    return ModelConfig(**base)


def run(model, batch=2, seq=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 128, (batch, seq), generator=g)
    positions = torch.arange(seq).expand(batch, seq)
    return tokens, model(tokens, positions)


VARIANTS = {
    "neox": {},
    "pythia": dict(rotary_pct=0.25, gpt_j_residual=True),
    "llama": dict(norm="rmsnorm", activation="swiglu", num_kv_heads=2, use_bias_in_attn_linear=False,
                  use_bias_in_mlp=False, use_bias_in_norms=False),
    "learned_tied": dict(pos_emb="learned", tied_embeddings=True),
    "alibi_mqa": dict(pos_emb="alibi", num_kv_heads=1),
    "sinusoidal_local": dict(pos_emb="sinusoidal", attention_types=("local", "global"),
                             sliding_window_width=4),
    "no_pos_scalenorm_geglu": dict(pos_emb="none", norm="scalenorm", activation="geglu"),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_architecture_starts_near_uniform_loss_and_backprops(name):
    model = GPTModel(config(**VARIANTS[name]))
    tokens, logits = run(model)
    assert logits.shape == (2, 16, 128)
    labels = torch.randint(0, 128, tokens.shape, generator=torch.Generator().manual_seed(9))
    loss = lm_loss(logits, (labels, torch.ones_like(labels)))
    # small-std init: predictions are close to uniform over the vocabulary
    assert abs(loss.item() - math.log(128)) < 0.6
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_same_seed_same_weights_and_other_seed_differs():
    a, b = GPTModel(config()), GPTModel(config())
    c = GPTModel(config(seed=7))
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.layers[0].word_embeddings.weight, c.layers[0].word_embeddings.weight)


def test_layer_weights_do_not_depend_on_the_number_of_layers():
    # each layer draws from its own generator: what a pipeline stage builds matches one process
    short, deep = GPTModel(config(num_layers=2)), GPTModel(config(num_layers=4))
    assert torch.equal(short.layers[1].attention.query_key_value.weight,
                       deep.layers[1].attention.query_key_value.weight)


def test_tied_embeddings_share_one_tensor():
    model = GPTModel(config(tied_embeddings=True))
    embeds = [m for m in model.layers if hasattr(m, "word_embeddings")]
    assert len(embeds) == 1
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith("weight") and "LMHead" in n for n in names)
    tokens, logits = run(model)
    hidden_to_logits = embeds[0].word_embeddings.weight
    assert logits.shape[-1] == hidden_to_logits.shape[0]


def test_causality_future_tokens_do_not_change_past_logits():
    for variant in ("neox", "alibi_mqa", "sinusoidal_local"):
        model = GPTModel(config(**VARIANTS[variant])).eval()
        tokens = torch.randint(0, 128, (1, 16))
        pos = torch.arange(16).unsqueeze(0)
        changed = tokens.clone()
        changed[0, 10:] = (changed[0, 10:] + 1) % 128
        with torch.no_grad():
            a, b = model(tokens, pos), model(changed, pos)
        assert torch.allclose(a[0, :10], b[0, :10], atol=1e-5), variant
        assert not torch.allclose(a[0, 10:], b[0, 10:]), variant


def test_sdpa_matches_reference_attention_with_gqa_and_masks():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 8, 16, generator=g)
    k, v = torch.randn(2, 2, 8, 16, generator=g), torch.randn(2, 2, 8, 16, generator=g)
    for mask in (None, torch.ones(8, 8, dtype=torch.bool).tril().view(1, 1, 8, 8),
                 torch.randn(1, 4, 8, 8, generator=g).masked_fill(
                     ~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))):
        assert torch.allclose(sdpa_attention(q, k, v, mask, 0.0, False),
                              reference_attention(q, k, v, mask, 0.0, True), atol=1e-5)


def test_lm_loss_ignores_masked_positions():
    logits = torch.randn(2, 4, 10)
    labels = torch.randint(0, 10, (2, 4))
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float)
    expected = F.cross_entropy(logits[mask.bool()], labels[mask.bool()])
    assert torch.allclose(lm_loss(logits, (labels, mask)), expected)


def test_rotary_matches_a_direct_complex_rotation():
    from megatron.model.positional import RotaryEmbedding

    rope = RotaryEmbedding(rotary_ndims=8, base=10000.0, max_positions=16)
    x = torch.randn(1, 1, 5, 8)
    cos, sin = rope.cos_sin(torch.arange(5).unsqueeze(0))
    out = rope.rotate(x, cos, sin)
    # rotate-half pairs channel i with i + 4, by angle pos * base^(-2i/8)
    pos = torch.arange(5).float().view(5, 1)
    theta = pos * (1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
    z = torch.complex(x[0, 0, :, :4], x[0, 0, :, 4:]) * torch.polar(torch.ones_like(theta), theta)
    assert torch.allclose(out[0, 0, :, :4], z.real, atol=1e-5)
    assert torch.allclose(out[0, 0, :, 4:], z.imag, atol=1e-5)


@pytest.mark.parametrize("rotary_ndims", [8, 4, 6])
def test_rotary_gradient_is_the_rotation_back_and_rounds_once_in_bf16(rotary_ndims):
    """The rotation's own backward (the gradient turned back by the same angles) against
    autograd's numerical gradient in fp64, on the model's strided queries with channels passing
    through; in bf16 both directions are the fp64 result rounded once."""
    from megatron.model.positional import RotaryEmbedding

    rope = RotaryEmbedding(rotary_ndims=rotary_ndims, base=10000.0, max_positions=16)
    cos, sin = rope.cos_sin(torch.arange(6).expand(2, 6))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 8, dtype=torch.float64, generator=g).transpose(1, 2)  # [b, h, s, d]
    assert torch.autograd.gradcheck(lambda t: rope.rotate(t, cos.double(), sin.double()),
                                    (x.clone().requires_grad_(),))
    grad = torch.randn(2, 3, 6, 8, dtype=torch.float64, generator=g)
    exact = x.clone().requires_grad_()
    out = rope.rotate(exact, cos.double(), sin.double())
    out.backward(grad)
    half = x.bfloat16().requires_grad_()
    got = rope.rotate(half, cos, sin)
    got.backward(grad.bfloat16())
    # the bf16 inputs' own values through the fp64 rotation, rounded once to bf16
    ref_in = half.detach().double().requires_grad_()
    ref = rope.rotate(ref_in, cos.double(), sin.double())
    ref.backward(grad.bfloat16().double())
    assert torch.equal(got, ref.bfloat16())
    assert torch.equal(half.grad, ref_in.grad.bfloat16())
    assert torch.allclose(half.grad.double(), exact.grad, atol=0.05)


@pytest.mark.parametrize("name", ["neox", "llama", "alibi_mqa", "sinusoidal_local", "learned_tied"])
def test_kv_cache_decoding_equals_full_forward(name):
    """Prefill 5 tokens, then feed 1 token at a time through the cache: the logits of every
    position equal one forward pass over the whole sequence."""
    from megatron.model.kv_cache import KVCache

    c = config(**VARIANTS[name])
    model = GPTModel(c).eval()
    tokens = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(10).expand(2, 10)
    with torch.no_grad():
        full = model(tokens, pos)
        cache = KVCache(c.num_layers, 2, 10, c.num_kv_heads, c.head_dim)
        parts = [model(tokens[:, :5], pos[:, :5], kv_cache=cache)]
        for t in range(5, 10):
            parts.append(model(tokens[:, t:t + 1], pos[:, t:t + 1], kv_cache=cache))
    assert cache.length == 10
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_kv_cache_with_left_padding_matches_unpadded_prompt():
    """A shorter prompt left-padded in a batch gives the logits it gets alone."""
    from megatron.model.kv_cache import KVCache

    c = config(**VARIANTS["llama"])
    model = GPTModel(c).eval()
    prompt = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        alone = model(prompt, torch.arange(4).unsqueeze(0))
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], dim=1)  # 3 pad tokens
        keep = torch.tensor([[False] * 3 + [True] * 4])
        positions = torch.tensor([[0, 0, 0, 0, 1, 2, 3]])
        cache = KVCache(c.num_layers, 1, 7, c.num_kv_heads, c.head_dim, key_padding=keep)
        out = model(padded, positions, kv_cache=cache)
    assert torch.allclose(out[:, 3:], alone, atol=1e-5)


@pytest.mark.parametrize("name", ["neox", "llama"])
def test_the_qkv_gradient_is_written_once_not_once_per_query_key_and_value(name):
    """The backward of the fused QKV projection's split writes its gradient in one op: slices
    of it would each write a zero-filled QKV-sized tensor, and the three be added up (five
    QKV-sized writes; at 1-3B, micro batch 8 and seq 2048 one is 192 MB)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.names.append((func.__name__.split(".")[0], getattr(out, "shape", None)))
            return out

    model = GPTModel(config(num_layers=1, **VARIANTS[name]))
    _, logits = run(model)
    attention = next(m for m in model.modules() if hasattr(m, "query_key_value"))
    qkv = (2, 16, attention.num_kv, attention.q_per_kv + 2, attention.head_dim)
    ops = Ops()
    with ops:
        logits.float().square().mean().backward()
    written = [name for name, shape in ops.names if shape == qkv]
    assert len(written) == 1 and written[0] in ("cat", "split_with_sizes_backward"), written
    assert attention.query_key_value.weight.grad.abs().sum() > 0
