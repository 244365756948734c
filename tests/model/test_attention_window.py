"""Attention type `flash` without flash-attn runs torch SDPA (and says so), and its sliding
window is GPT-NeoX's (flash-attn's causal window_size=(W, -1): query i sees keys i-W .. i) for
every kernel; `local` sees W keys. Checked by which input tokens can change an output."""

import logging

import pytest
import torch

from megatron.model import attention_impls
from megatron.model.attention_impls import reference_attention, sdpa_attention
from megatron.model.gpt import GPTModel
from tests.model.test_gpt import config

W, S = 3, 16


def one_layer(attention_type: str, kernel=None) -> GPTModel:
    model = GPTModel(config(num_layers=1, attention_types=(attention_type,),
                            sliding_window_width=W)).eval()
    if kernel is not None:
        for module in model.modules():
            if hasattr(module, "kernel"):
                module.kernel = kernel
    return model


def changes_output(model, position: int, changed_token: int) -> bool:
    """Whether changing the input token at `changed_token` changes the logits at `position`."""
    tokens = torch.randint(0, 128, (1, S), generator=torch.Generator().manual_seed(5))
    other = tokens.clone()
    other[0, changed_token] = (other[0, changed_token] + 7) % 128
    pos = torch.arange(S).unsqueeze(0)
    with torch.no_grad():
        a, b = model(tokens, pos)[0, position], model(other, pos)[0, position]
    return not torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("kernel", [None, sdpa_attention, reference_attention],
                         ids=["as-selected", "sdpa", "reference"])
def test_flash_window_sees_w_plus_one_keys(kernel):
    model = one_layer("flash", kernel)
    i = 10
    assert changes_output(model, i, i - W)  # the oldest key in the window
    assert not changes_output(model, i, i - W - 1)  # just outside it
    assert not changes_output(model, i, i + 1)  # causal


@pytest.mark.parametrize("kernel", [sdpa_attention, reference_attention], ids=["sdpa", "ref"])
def test_local_window_sees_w_keys(kernel):
    model = one_layer("local", kernel)
    assert changes_output(model, 10, 10 - W + 1)
    assert not changes_output(model, 10, 10 - W)


def test_flash_layers_equal_global_ones_without_a_window():
    flash = GPTModel(config(attention_types=("flash", "flash"))).eval()
    plain = GPTModel(config()).eval()
    tokens = torch.randint(0, 128, (2, S), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(S).expand(2, S)
    with torch.no_grad():
        assert torch.equal(flash(tokens, pos), plain(tokens, pos))


def test_flash_without_flash_attn_runs_sdpa_and_says_so(monkeypatch, caplog):
    real = attention_impls.importlib.util.find_spec
    monkeypatch.setattr(attention_impls.importlib.util, "find_spec",
                        lambda name, *a: None if name == "flash_attn" else real(name, *a))
    monkeypatch.setattr(attention_impls, "_LOGGED", set())
    with caplog.at_level(logging.INFO, logger="megatron"):
        assert attention_impls.attention_impl("flash") is sdpa_attention
        attention_impls.attention_impl("flash")
    lines = [r.getMessage() for r in caplog.records if "attention 'flash'" in r.getMessage()]
    assert lines == ["attention 'flash': flash-attn is not installed; torch SDPA computes the "
                     "same attention (its flash kernel on CUDA, its math kernel on CPU)"]
