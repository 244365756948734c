"""Weight initialisation methods, by GPT-NeoX name, drawing from an explicit generator.

Every layer initialises from its own generator seeded by (seed, layer number), so the same seed
gives the same full weights whichever rank or pipeline stage builds the layer.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

InitFn = Callable[[torch.Tensor, torch.Generator], None]


def _normal(std: float) -> InitFn:
    def init(t: torch.Tensor, gen: torch.Generator) -> None:
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).mul_(std))
    return init


def _orthogonal(gain: float) -> InitFn:
    """A (semi-)orthogonal matrix (Saxe et al. 2013) times `gain`: every singular value is gain."""
    def init(t: torch.Tensor, gen: torch.Generator) -> None:
        rows, cols = t.shape[0], t.numel() // t.shape[0]
        flat = torch.randn(max(rows, cols), min(rows, cols), generator=gen, dtype=torch.float32)
        q, r = torch.linalg.qr(flat)
        q = q * torch.sign(torch.diagonal(r))
        if rows < cols:
            q = q.T
        with torch.no_grad():
            t.copy_(q.reshape(t.shape).mul_(gain))
    return init


def _xavier(uniform: bool) -> InitFn:
    def init(t: torch.Tensor, gen: torch.Generator) -> None:
        fan_out, fan_in = t.shape[0], t.numel() // t.shape[0]
        std = math.sqrt(2.0 / (fan_in + fan_out))
        with torch.no_grad():
            if uniform:
                bound = math.sqrt(3.0) * std
                t.copy_(torch.rand(t.shape, generator=gen).mul_(2 * bound).sub_(bound))
            else:
                t.copy_(torch.randn(t.shape, generator=gen).mul_(std))
    return init


def _make(name: str, std: float, num_layers: int, hidden_size: int) -> InitFn:
    scaled = std / math.sqrt(2.0 * num_layers)
    makers: dict[str, Callable[[], InitFn]] = {
        "normal": lambda: _normal(std),
        "scaled_normal": lambda: _normal(scaled),
        # GPT-NeoX's for Mamba: one residual branch per layer, N(0, std / sqrt(num_layers))
        "single_residual_scaled_normal": lambda: _normal(std / math.sqrt(num_layers)),
        # GPT-NeoX's orthogonal_init_method: gain sqrt(2 / n_layers), n_layers defaulting to 1
        "orthogonal": lambda: _orthogonal(math.sqrt(2.0)),
        "scaled_orthogonal": lambda: _orthogonal(math.sqrt(2.0 / num_layers)),
        "xavier_uniform": lambda: _xavier(True),
        "xavier_normal": lambda: _xavier(False),
        "small_init": lambda: _normal(math.sqrt(2.0 / (5.0 * hidden_size))),
        "wang_init": lambda: _normal(2.0 / num_layers / math.sqrt(hidden_size)),
    }
    if name not in makers:
        raise ValueError(f"init method {name!r} is not known; valid: {', '.join(sorted(makers))}")
    return makers[name]()


INIT_METHODS = ("normal", "scaled_normal", "orthogonal", "scaled_orthogonal", "xavier_uniform",
                "xavier_normal", "small_init", "wang_init", "single_residual_scaled_normal")


def init_methods(config) -> tuple[InitFn, InitFn]:
    """The (input-side, output-projection) init functions the model config asks for."""
    args = (config.init_method_std, config.num_layers, config.hidden_size)
    return _make(config.init_method, *args), _make(config.output_layer_init_method, *args)


def layer_generator(seed: int, layer_number: int) -> torch.Generator:
    """A CPU generator owned by one layer: the same (seed, layer) always draws the same weights."""
    return torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + layer_number)
