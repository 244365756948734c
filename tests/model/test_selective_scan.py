"""Mamba-1's selective scan and causal conv: the chunked scan gives the step-by-step reference's
output, final state and every gradient, for ragged, short and one-step sequences, with or
without D, z, delta_bias, softplus and an initial state; bf16 inputs come back bf16; huge and
tiny decays stay finite and exact; a sequence run in two parts through the returned state equals
the whole; decoding one token at a time from a prefill's states gives the full-sequence outputs;
the conv equals F.conv1d padded by k-1; everything agrees with Hugging Face's torch Mamba."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from megatron.model.selective_scan import (causal_conv1d, causal_conv1d_update, selective_scan,
                                           selective_state_update)


def scan_inputs(b=2, d=5, n=4, length=37, seed=0,
                dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Every selective_scan input, random, softplus(delta + delta_bias) ~ 0.5 on average."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    return dict(u=randn(b, d, length), delta=randn(b, d, length) - 1,
                A=-torch.exp(randn(d, n)), B=randn(b, n, length), C=randn(b, n, length),
                D=randn(d), z=randn(b, d, length), delta_bias=randn(d),
                initial_state=randn(b, d, n))


def run(inputs: dict, options: dict, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    return selective_scan(**inputs, **options, return_state=True, **kwargs)


def outputs_and_grads(inputs: dict, options: dict, **kwargs) -> list[torch.Tensor]:
    """y, h_l and the gradient of a random weighting of both with respect to every input."""
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    y, h = run(leaves, options, **kwargs)
    g = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=g)).sum() + (h * torch.randn(h.shape,
                                                                            generator=g)).sum()
    return [y, h, *torch.autograd.grad(loss, list(leaves.values()))]


def assert_all_close(ours: list, theirs: list, rtol=1e-5, atol=1e-5):
    for a, b in zip(ours, theirs, strict=True):
        scale = max(1.0, float(b.detach().abs().max()))
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("length,chunk", [(37, 8), (5, 16), (1, 8), (64, 16), (40, 64)])
@pytest.mark.parametrize("extras", [("D", "z", "delta_bias", "initial_state"), ()])
@pytest.mark.parametrize("softplus", [True, False])
def test_chunked_equals_reference_output_state_and_every_gradient(length, chunk, extras,
                                                                  softplus):
    inputs = scan_inputs(length=length)
    if not softplus:  # keep delta + delta_bias >= 0: decaying states
        inputs.update(delta=inputs["delta"].abs(), delta_bias=inputs["delta_bias"].abs())
    inputs = {k: v for k, v in inputs.items() if k in ("u", "delta", "A", "B", "C") + extras}
    options = dict(delta_softplus=softplus)
    reference = outputs_and_grads(inputs, options, method="reference")
    assert_all_close(outputs_and_grads(inputs, options, method="chunked", chunk=chunk), reference)
    y_auto, _ = run(inputs, options, method="auto", chunk=chunk)
    torch.testing.assert_close(y_auto, reference[0], rtol=1e-5, atol=1e-5)


def test_chunked_gradients_are_the_derivatives_in_fp64():
    inputs = {k: v.requires_grad_() for k, v in scan_inputs(d=3, length=10,
                                                             dtype=torch.float64).items()}
    names = list(inputs)

    def scan(*values):
        return selective_scan(**dict(zip(names, values)), chunk=4, return_state=True)

    assert torch.autograd.gradcheck(scan, tuple(inputs.values()))


def test_bf16_inputs_give_bf16_output_close_to_fp32():
    inputs = scan_inputs(length=48)
    low = {k: v.to(torch.bfloat16) if k in ("u", "delta", "B", "C", "z") else v
           for k, v in inputs.items()}
    y, h = run(low, {}, chunk=16)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
    y_ref, h_ref = run({k: v.float() for k, v in low.items()}, {}, method="reference")
    torch.testing.assert_close(y.float(), y_ref, rtol=1e-2, atol=1e-2 * float(y_ref.abs().max()))
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5 * float(h_ref.abs().max()))


@pytest.mark.parametrize("case", ["huge", "tiny", "spikes", "growth"])
def test_extreme_decays_stay_finite_and_equal_the_reference(case):
    inputs = scan_inputs(length=70)
    options = {}
    if case == "huge":  # exp(delta A) underflows to 0 at every step: each state is its own input
        inputs.update(delta=torch.full_like(inputs["delta"], 1e3), A=inputs["A"] * 1e3)
    elif case == "tiny":  # exp(delta A) rounds to 1: the state is a running sum
        inputs.update(delta=inputs["delta"].abs() * 1e-4, A=inputs["A"] * 1e-6)
        options = dict(delta_softplus=False)
    elif case == "spikes":  # a few steps that reset the state make their chunks split
        inputs.update(delta=0.02 * inputs["delta"].abs(), delta_bias=torch.zeros(5))
        inputs["delta"][..., [3, 30, 31, 66]] = 60.0
        options = dict(delta_softplus=False)
    else:  # negative steps without softplus: the state grows, as the recurrence says
        inputs.update(delta=-0.05 * inputs["delta"].abs(), delta_bias=torch.zeros(5))
        options = dict(delta_softplus=False)
    ours = outputs_and_grads(inputs, options, chunk=16)
    assert all(bool(t.isfinite().all()) for t in ours)
    assert_all_close(ours, outputs_and_grads(inputs, options, method="reference"))


@pytest.mark.parametrize("method", ["chunked", "reference"])
def test_two_parts_through_the_returned_state_equal_the_whole(method):
    inputs = scan_inputs(length=50)
    whole, h_whole = run(inputs, {}, method=method, chunk=16)
    sequence = ("u", "delta", "B", "C", "z")
    first = {k: v[..., :23] if k in sequence else v for k, v in inputs.items()}
    y_first, h = run(first, {}, method=method, chunk=16)
    rest = {k: v[..., 23:] if k in sequence else v for k, v in inputs.items()}
    y_rest, h_rest = run({**rest, "initial_state": h}, {}, method=method, chunk=16)
    torch.testing.assert_close(torch.cat([y_first, y_rest], -1), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_rest, h_whole, rtol=1e-5, atol=1e-5)


class TinyMixer:
    """Mamba's token mixing with random weights: conv, then dt, B, C projected from its output."""

    def __init__(self, d=6, n=4, k=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.weight, self.bias = 0.5 * torch.randn(d, k, generator=g), torch.randn(d, generator=g)
        self.W_dt, self.W_B, self.W_C = (0.3 * torch.randn(m, d, generator=g) for m in (d, n, n))
        self.A = -torch.exp(torch.randn(d, n, generator=g))
        self.D, self.dt_bias = torch.randn(d, generator=g), torch.randn(d, generator=g)

    def project(self, xc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """xc [b, d, ...] -> dt [b, d, ...], B and C [b, n, ...]."""
        return tuple(torch.einsum("md,bd...->bm...", W, xc) for W in (self.W_dt, self.W_B,
                                                                       self.W_C))

    def prefill(self, x, z, return_state=False):
        xc, conv_state = causal_conv1d(x, self.weight, self.bias, return_state=True)
        dt, B, C = self.project(xc)
        y, ssm_state = selective_scan(xc, dt, self.A, B, C, self.D, z, self.dt_bias,
                                      return_state=True, chunk=4)
        return (y, conv_state, ssm_state) if return_state else y

    def step(self, x, z, conv_state, ssm_state):
        xc = causal_conv1d_update(conv_state, x, self.weight, self.bias)
        dt, B, C = self.project(xc)
        return selective_state_update(ssm_state, xc, dt, self.A, B, C, self.D, z, self.dt_bias)


@pytest.mark.parametrize("prefix", [2, 7])
def test_decoding_one_token_at_a_time_equals_the_full_sequence(prefix):
    mixer, length = TinyMixer(), 13
    g = torch.Generator().manual_seed(3)
    x, z = torch.randn(2, 6, length, generator=g), torch.randn(2, 6, length, generator=g)
    y, conv_state, ssm_state = mixer.prefill(x[..., :prefix], z[..., :prefix], return_state=True)
    assert conv_state.shape == (2, 6, 4) and ssm_state.shape == (2, 6, 4)
    steps = [mixer.step(x[..., t], z[..., t], conv_state, ssm_state) for t in range(prefix, length)]
    decoded = torch.cat([y, torch.stack(steps, -1)], -1)
    torch.testing.assert_close(decoded, mixer.prefill(x, z), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [1, 3, 20])
@pytest.mark.parametrize("activation", ["silu", None])
def test_causal_conv1d_is_conv1d_padded_by_k_minus_1(length, activation):
    g = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(2, 5, length, generator=g), torch.randn(5, 1, 4, generator=g),
                       torch.randn(5, generator=g))
    expected = F.conv1d(x, weight, bias, padding=3, groups=5)[..., :length]
    expected = F.silu(expected) if activation else expected
    torch.testing.assert_close(causal_conv1d(x, weight, bias, activation), expected)
    torch.testing.assert_close(causal_conv1d(x, weight[:, 0], bias, activation), expected)


def test_causal_conv1d_state_holds_the_last_k_inputs_and_continues_the_sequence():
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(2, 5, 11, generator=g), torch.randn(5, 4, generator=g)
    _, state = causal_conv1d(x[..., :2], weight, return_state=True)
    torch.testing.assert_close(state, F.pad(x[..., :2], (2, 0)))  # zeros before the start
    first, state = causal_conv1d(x[..., :6], weight, return_state=True)
    torch.testing.assert_close(state, x[..., 2:6])
    rest, state = causal_conv1d(x[..., 6:], weight, initial_state=state, return_state=True)
    torch.testing.assert_close(torch.cat([first, rest], -1), causal_conv1d(x, weight))
    torch.testing.assert_close(state, x[..., -4:])


def test_scan_and_step_equal_transformers_torch_mamba_functions():
    from transformers.models.mamba import modeling_mamba as hf

    i = scan_inputs(length=30)
    y, h = hf.mamba_selective_scan(i["u"], i["delta"], i["A"], i["B"], i["C"], D=i["D"], z=i["z"],
                                   delta_bias=i["delta_bias"], delta_softplus=True,
                                   return_last_state=True)
    assert_all_close(run({k: v for k, v in i.items() if k != "initial_state"}, {}, chunk=8),
                     [y, h])
    state, theirs_state = i["initial_state"].clone(), i["initial_state"].clone()
    step = dict(A=i["A"], B=i["B"][..., 0], C=i["C"][..., 0], D=i["D"], z=i["z"][..., 0],
                dt_bias=i["delta_bias"])
    ours = selective_state_update(state, i["u"][..., 0], i["delta"][..., 0], **step)
    theirs = hf.mamba_selective_state_update(theirs_state, i["u"][..., 0], i["delta"][..., 0],
                                             **step, dt_softplus=True)
    assert_all_close([ours, state], [theirs, theirs_state])


def test_conv_and_step_equal_transformers_torch_mamba_functions():
    from transformers.models.mamba import modeling_mamba as hf

    g = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(2, 5, 9, generator=g), torch.randn(5, 4, generator=g),
                       torch.randn(5, generator=g))
    torch.testing.assert_close(causal_conv1d(x, weight, bias),
                               hf.causal_conv1d_fn(x, weight, bias, activation="silu"))
    state = torch.randn(2, 5, 4, generator=g)
    theirs_state = state.clone()
    ours = causal_conv1d_update(state, x[..., 0], weight, bias)
    theirs = hf.causal_conv1d_update(x[..., :1], theirs_state, weight, bias, activation="silu")
    assert_all_close([ours, state], [theirs[..., 0], theirs_state])


def test_equals_transformers_mamba_mixer():
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer

    config = MambaConfig(hidden_size=8, state_size=4, expand=2, conv_kernel=4, time_step_rank=3,
                         num_hidden_layers=1)
    mixer = MambaMixer(config, layer_idx=0).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    hidden = torch.randn(2, 19, 8, generator=g)
    with torch.no_grad():
        x, z = mixer.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)    # [b, 16, l] each
        xc = causal_conv1d(x, mixer.conv1d.weight, mixer.conv1d.bias)
        dt, B, C = mixer.x_proj(xc.transpose(1, 2)).split([3, 4, 4], dim=-1)
        y = selective_scan(xc, mixer.dt_proj.weight @ dt.transpose(1, 2), -torch.exp(mixer.A_log),
                           B.transpose(1, 2), C.transpose(1, 2), mixer.D, z, mixer.dt_proj.bias,
                           chunk=8)
        torch.testing.assert_close(mixer.out_proj(y.transpose(1, 2)), mixer(hidden),
                                   rtol=1e-5, atol=1e-5)


def test_wrong_method_or_shape_is_refused_with_the_reason():
    i = scan_inputs(length=6)
    with pytest.raises(ValueError, match=r"unknown method 'fast'; valid: \['auto', 'chunked', "
                                         r"'reference'\]"):
        selective_scan(i["u"], i["delta"], i["A"], i["B"], i["C"], method="fast")
    with pytest.raises(ValueError, match=r"B has shape \(2, 4, 5\), expected \(2, 4, 6\)"):
        selective_scan(i["u"], i["delta"], i["A"], i["B"][..., :5], i["C"])
