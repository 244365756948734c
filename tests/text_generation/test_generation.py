"""Batched generation: KV cache equals recompute, padding is invisible, stops, and the checks
made before generating (A13 stop ids, A14 lengths, A25 inference mode, A29 cache memory)."""

import pytest
import torch

from megatron.text_generation import checks
from megatron.text_generation.checks import check_kv_cache_fits, validate_stop_ids
from megatron.text_generation.generation import (Generated, cut_at_stop, generate,
                                                 generate_batch, sample_text, stop_string_checker)
from megatron.text_generation.inference_model import InferenceModel
from megatron.text_generation.sampling import SamplingParams, seeded_generators
from tests.text_generation.models import VARIANTS, random_weights, small_config, small_model

GREEDY = SamplingParams()
NO_STOP = frozenset()


def prompts_of(lengths, seed=0, vocab=128):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_with_kv_cache_equals_recompute_token_for_token(variant):
    model, _ = small_model(variant)
    prompts = prompts_of([3, 9, 1, 6])  # different lengths: left padding in one batch
    cached = generate(model, prompts, 20, GREEDY, NO_STOP, batch_size=4, use_cache=True)
    recomputed = generate(model, prompts, 20, GREEDY, NO_STOP, batch_size=4, use_cache=False)
    assert [g.ids for g in cached] == [g.ids for g in recomputed]
    assert all(len(g.ids) == 20 and g.stop_reason == "length" for g in cached)


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_prompt_gives_the_same_tokens_alone_or_left_padded_in_a_batch(use_cache):
    model, _ = small_model("llama_gqa")
    prompts = prompts_of([2, 11, 5])
    batched = generate(model, prompts, 12, GREEDY, NO_STOP, batch_size=3, use_cache=use_cache)
    alone = [generate(model, [p], 12, GREEDY, NO_STOP, use_cache=use_cache)[0] for p in prompts]
    assert [g.ids for g in batched] == [g.ids for g in alone]
    assert [g.prompt_ids for g in batched] == prompts


def long_memory_mamba(variant: str) -> InferenceModel:
    """`variant` with init std 0.2 (at 0.02 a tied Mamba model only repeats the last prompt
    token), convolution biases at the module's own init scale (U(-0.5, 0.5); padding enters
    the convolution as zeros and leaves it as silu(bias)) and a slowly decaying scan
    (A = -e^-3 = -0.05 for every channel, not -1..-16): padding let into a layer's
    convolution or state would still sway the tokens many positions later."""
    config = small_config(**{**VARIANTS[variant], "init_method_std": 0.2})
    weights = random_weights(config)
    g = torch.Generator().manual_seed(3)
    for name, w in weights.items():
        if name.endswith("mixer.A_log"):
            weights[name] = torch.full_like(w, -3.0)
        elif name.endswith("mixer.conv1d.bias"):
            weights[name] = torch.rand(w.shape, generator=g) - 0.5
    return InferenceModel.from_canonical(config, weights)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("variant", ["mamba", "mamba_hybrid"])
def test_a_mamba_prompt_gives_the_same_tokens_alone_or_left_padded_in_a_batch(variant,
                                                                              use_cache):
    """docs/train.md: left padding is kept out of each Mamba layer's convolution and state,
    in the cached scan state and when every step recomputes the prompt."""
    model = long_memory_mamba(variant)
    prompts = prompts_of([2, 11, 5])  # 9 and 6 tokens of padding before rows 0 and 2
    batched = generate(model, prompts, 12, GREEDY, NO_STOP, batch_size=3, use_cache=use_cache)
    alone = [generate(model, [p], 12, GREEDY, NO_STOP, use_cache=use_cache)[0] for p in prompts]
    assert [g.ids for g in batched] == [g.ids for g in alone]
    assert len({t for g in alone for t in g.ids}) > 12  # not one token repeated per row


def test_seeded_sampling_is_reproducible_and_independent_of_batching():
    model, _ = small_model()
    prompts = prompts_of([4, 7, 2, 5])
    params = SamplingParams(temperature=1.0, top_k=20)

    def run(seed, batch):
        return [g.ids for g in generate(model, prompts, 10, params, NO_STOP, batch_size=batch,
                                        generators=seeded_generators(seed, range(len(prompts))))]

    assert run(5, 4) == run(5, 4) == run(5, 1)
    assert run(5, 4) != run(6, 4)


def test_a_stop_id_ends_only_its_row_and_stop_strings_cut_the_text():
    model, _ = small_model()
    prompts = prompts_of([3, 6])
    free = generate(model, prompts, 10, GREEDY, NO_STOP, batch_size=2)
    stop = free[0].ids[4]  # the 5th token row 0 generates
    stopped = generate(model, prompts, 10, GREEDY, frozenset({stop}), batch_size=2)
    first = free[0].ids.index(stop)
    assert stopped[0].ids == free[0].ids[:first + 1] and stopped[0].stop_reason == "stop_token"
    if stop not in free[1].ids:
        assert stopped[1].ids == free[1].ids and stopped[1].stop_reason == "length"

    def text(ids):
        return "".join(f"<{i}>" for i in ids)

    target = f"<{free[1].ids[3]}>"
    at = free[1].ids.index(free[1].ids[3])
    by_text = generate(model, prompts[1:], 10, GREEDY, NO_STOP,
                       text_stop=stop_string_checker((target,), text))[0]
    assert by_text.stop_reason == "stop_string" and by_text.ids == free[1].ids[:at + 1]
    assert cut_at_stop(text(by_text.ids), (target,)) == text(free[1].ids[:at])


def test_a_sample_cut_inside_a_character_ends_at_the_last_whole_one(small_data):
    """The built-in byte-level BPE gives each UTF-8 byte of a rare character a token of its own:
    maximum_tokens running out between them leaves the character out of the text, not U+FFFD;
    the ids keep every token, and an ending that is not a cut keeps what it decodes to."""
    from megatron.tokenizer import build_tokenizer

    tok = build_tokenizer("HFTokenizer", small_data[1])
    ids = tok.tokenize("a price of 5\u20ac, paid")
    cuts = [k for k in range(1, len(ids)) if tok.detokenize(ids[:k]).endswith("\ufffd")]
    assert cuts, [tok.detokenize([i]) for i in ids]  # the euro sign takes several tokens
    cut = Generated([0], ids[:cuts[0]], "length")
    assert tok.detokenize(cut.ids) == "a price of 5\ufffd"
    assert sample_text(tok.detokenize, cut, ()) == "a price of 5"
    whole = Generated([0], ids, "length")
    assert sample_text(tok.detokenize, whole, ()) == "a price of 5\u20ac, paid"
    assert sample_text(tok.detokenize, Generated([0], ids + [tok.eod], "stop_token"),
                       (", paid",)) == "a price of 5\u20ac"
    # a model that ends on bytes that are no character keeps them, as it wrote them
    ended = Generated([0], ids[:cuts[0]] + [tok.eod], "stop_token")
    assert sample_text(tok.detokenize, ended, ()) == "a price of 5\ufffd"


def test_prompt_plus_maximum_tokens_beyond_the_context_is_refused_with_the_numbers():
    model, _ = small_model()  # max_position_embeddings 48
    with pytest.raises(ValueError, match=r"prompt 1 has 40 tokens: prompt tokens \+ "
                       r"maximum_tokens\(10\) must not exceed max_position_embeddings\(48\); "
                       r"shorten the prompt to at most 38 tokens or lower maximum_tokens"):
        generate(model, prompts_of([5, 40]), 10, GREEDY, NO_STOP)
    assert len(generate(model, prompts_of([38]), 10, GREEDY, NO_STOP)[0].ids) == 10  # fits
    with pytest.raises(ValueError, match=r"^maximum_tokens\(48\) must be below "
                       r"max_position_embeddings\(48\), as every prompt has at least one token; "
                       r"lower maximum_tokens$"):
        generate(model, prompts_of([1]), 48, GREEDY, NO_STOP)


def test_bad_stop_token_ids_are_refused_against_the_tokenizer():
    assert validate_stop_ids([5], vocab_size=50, eod=0) == frozenset({0, 5})
    with pytest.raises(ValueError, match=r"stop_token_ids entry 50 is not a token id of the "
                       r"tokenizer \(ids are 0..49\)"):
        validate_stop_ids([50], vocab_size=50, eod=0)
    with pytest.raises(ValueError, match="stop_token_ids entry -1"):
        validate_stop_ids([-1], vocab_size=50, eod=0)


def test_kv_cache_larger_than_available_memory_is_refused_with_the_figure(monkeypatch):
    need = check_kv_cache_fits(2, 4, 48, 4, 16, torch.float32, torch.device("cpu"),
                               available=(10 * 2**20, "test"))
    assert need == 2 * 2 * 4 * 48 * 4 * 16 * 4
    with pytest.raises(RuntimeError, match=r"the KV cache needs 16.00 GiB \(32 layers x batch 64 x "
                       r"2048 positions x 8 KV heads x head_dim 128 x keys and values in "
                       r"torch.float16\) but only 1.00 GiB is available \(test\)"):
        check_kv_cache_fits(32, 64, 2048, 8, 128, torch.float16, torch.device("cpu"),
                            available=(2**30, "test"))
    model, _ = small_model()
    monkeypatch.setattr(checks, "available_memory", lambda device: (1000, "patched"))
    with pytest.raises(RuntimeError, match=r"KV cache needs .* only 0.00 GiB is available "
                       r"\(patched\); lower generation_batch_size"):
        generate(model, prompts_of([4]), 4, GREEDY, NO_STOP)
    # recompute needs no cache
    assert len(generate(model, prompts_of([4]), 4, GREEDY, NO_STOP, use_cache=False)[0].ids) == 4


def test_the_model_refuses_to_run_outside_eval_and_inference_mode():
    model, _ = small_model()
    tokens = torch.tensor([[3, 4, 5]])
    positions = torch.arange(3).unsqueeze(0)
    with pytest.raises(RuntimeError, match=r"must run under torch.inference_mode\(\) \(A25\)"):
        model.forward(tokens, positions)
    model.model.train()
    with pytest.raises(RuntimeError, match=r"training mode .* need model.eval\(\) \(A25\)"):
        generate_batch(model, [[3, 4, 5]], 2, GREEDY, NO_STOP)
    model.model.eval()
    assert len(generate_batch(model, [[3, 4, 5]], 2, GREEDY, NO_STOP)[0].ids) == 2


def test_padded_vocabulary_rows_are_never_sampled_nor_counted():
    model, weights = small_model(vocab=128)
    # this run pads the 128-row checkpoint to 130 rows (think: a tp that does not divide it)
    from megatron.text_generation.inference_model import InferenceModel
    from megatron.checkpointing.reader import resize_vocab
    import dataclasses

    config = dataclasses.replace(model.config, padded_vocab_size=130)
    wide = InferenceModel.from_canonical(config, resize_vocab(weights, config.num_layers, 130),
                                         token_limit=100, trained_vocab=128)
    with torch.inference_mode():
        logits = wide.forward(torch.tensor([[3, 4, 5]]), torch.arange(3).unsqueeze(0))
        narrow = model.forward(torch.tensor([[3, 4, 5]]), torch.arange(3).unsqueeze(0))
    assert torch.isinf(logits[..., 128:]).all() and torch.equal(logits[..., :128], narrow)
    hot = generate(wide, prompts_of([3] * 8), 8, SamplingParams(50.0), NO_STOP,
                   generators=seeded_generators(0, range(8)))
    assert max(max(g.ids) for g in hot) < 100


@pytest.mark.parametrize("variant", ["mamba", "mamba_hybrid"])
def test_a_mamba_models_cached_state_gives_the_tokens_of_recomputing(variant):
    """The cached convolution and scan state of each Mamba layer, carried from step to step,
    equal recomputing the whole sequence, on a model whose layers decide its tokens."""
    model = long_memory_mamba(variant)
    prompts = prompts_of([3, 9, 1, 6])
    cached = generate(model, prompts, 20, GREEDY, NO_STOP, batch_size=4, use_cache=True)
    recomputed = generate(model, prompts, 20, GREEDY, NO_STOP, batch_size=4, use_cache=False)
    assert [g.ids for g in cached] == [g.ids for g in recomputed]
    assert len({t for g in cached for t in g.ids}) > 20  # not one token repeated per row
