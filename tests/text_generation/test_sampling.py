"""Sampling is a pure function of logits and generators: greedy, temperature, top-k/p, seeds."""

import pytest
import torch

from megatron.text_generation.sampling import (SamplingParams, filter_logits, sample,
                                               seeded_generators)


def logits_of(probs):
    return torch.tensor(probs).log().unsqueeze(0)  # [1, V]


def test_greedy_is_argmax_and_needs_no_randomness():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert SamplingParams().greedy
    assert torch.equal(sample(logits, SamplingParams()), logits.argmax(-1))


@pytest.mark.parametrize("cut", [dict(top_k=3), dict(top_p=0.9)])
def test_temperature_0_with_top_k_or_top_p_samples_the_unscaled_logits_as_gpt_neox(cut):
    """GPT-NeoX decodes greedily only when temperature, top_k and top_p are all 0; temperature
    0 with a cut samples from the cut logits, left unscaled (its text_generation_utils.py)."""
    params = SamplingParams(temperature=0.0, **cut)
    assert not params.greedy
    logits = logits_of([0.4, 0.35, 0.2, 0.05])
    assert torch.equal(filter_logits(logits, params),
                       filter_logits(logits, SamplingParams(temperature=1.0, **cut)))
    draws = {sample(logits, params, seeded_generators(7, [i])).item() for i in range(200)}
    assert draws == {0, 1, 2}


def test_top_k_and_top_p_keep_exactly_the_expected_tokens():
    logits = logits_of([0.5, 0.3, 0.15, 0.05])

    def kept(**kw):
        return torch.isfinite(filter_logits(logits, SamplingParams(1.0, **kw)))[0].tolist()

    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.5) == [True, False, False, False]      # 0.5 alone reaches 0.5
    assert kept(top_p=0.7) == [True, True, False, False]       # 0.5 + 0.3 reaches 0.7
    assert kept(top_p=0.96) == [True, True, True, True]
    assert kept(top_k=3, top_p=0.7) == [True, True, False, False]
    draws = torch.cat([sample(logits, SamplingParams(1.0, top_p=0.7), seeded_generators(1, [i]))
                       for i in range(300)])
    assert set(draws.tolist()) == {0, 1}


def test_temperature_sharpens_and_flattens_the_distribution():
    logits = logits_of([0.6, 0.3, 0.1])
    cold = filter_logits(logits, SamplingParams(0.1)).softmax(-1)[0]
    hot = filter_logits(logits, SamplingParams(10.0)).softmax(-1)[0]
    assert cold[0] > 0.99 and abs(hot[0] - 1 / 3) < 0.05


def test_same_seed_same_samples_and_rows_do_not_depend_on_each_other():
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(1.0)
    rows = list(range(16))
    a = sample(logits, params, seeded_generators(42, rows))
    assert torch.equal(a, sample(logits, params, seeded_generators(42, rows)))
    assert not torch.equal(a, sample(logits, params, seeded_generators(43, rows)))
    # row 2 alone, with sample index 2's generator, draws what it drew inside the batch
    assert sample(logits[2:3], params, seeded_generators(42, [2])).item() == a[2].item()


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), r"temperature\(-1.0\) must be at least 0"),
    (dict(top_k=-2), r"top_k\(-2\) must be at least 0"),
    (dict(top_p=1.5), r"top_p\(1.5\) must be in \[0, 1\]"),
])
def test_bad_sampling_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
