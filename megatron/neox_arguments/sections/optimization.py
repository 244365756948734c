"""The optimizer and learning-rate schedule sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..fields import option

ADAM_DEFAULT_BETAS = (0.9, 0.999)
ADAM_DEFAULT_EPS = 1.0e-8
DEFAULT_LR = 0.001
# What optimizer.params may hold, by optimizer.type: GPT-NeoX passes params to the optimizer's
# constructor (DeepSpeed's FusedAdam for Adam, MuSGD for SGD), so these are those arguments.
# weight_decay is refused (the top-level key decays the matrices); bias_correction false
# and amsgrad true are refused (torch's Adam has no switch for the first; FusedAdam refuses the
# second); set_grad_none decides how FusedAdam frees gradients and changes no result.
OPTIMIZER_PARAMS = {
    "adam": ("lr", "betas", "eps", "adam_w_mode", "bias_correction", "amsgrad", "set_grad_none"),
    "sgd": ("lr", "momentum", "dampening", "nesterov"),
}
OPTIMIZER_PARAMS["adamw"] = OPTIMIZER_PARAMS["adam"]


@dataclass(frozen=True)
class OptimizerArgs:
    """The torch optimizer and its regularisation; DeepSpeed never builds the optimizer."""

    optimizer: dict = option(
        {"type": "Adam", "params": {"lr": DEFAULT_LR, "betas": [0.9, 0.999], "eps": 1.0e-8}},
        "Optimizer as {type, params}: type Adam, AdamW or SGD; params are passed to the torch "
        "optimizer (lr is the peak learning rate).",
    )
    weight_decay: float = option(
        0.1, "Weight decay coefficient (not applied to biases and norm weights)."
    )
    gradient_clipping: float = option(
        1.0, "Clip gradients to this global L2 norm; 0 disables clipping."
    )

    @property
    def type(self) -> str:
        """The optimizer name, e.g. "Adam"."""
        return self.optimizer.get("type", "Adam")

    @property
    def params(self) -> dict[str, Any]:
        """The optimizer's constructor arguments as written (lr, betas, eps, ...)."""
        return dict(self.optimizer.get("params") or {})

    @property
    def lr(self) -> float:
        """Peak learning rate (optimizer.params.lr; GPT-NeoX's default 0.001 when absent)."""
        return float(self.params.get("lr", DEFAULT_LR))

    @property
    def betas(self) -> tuple[float, float]:
        """Adam betas (optimizer.params.betas; (0.9, 0.999) when absent)."""
        b1, b2 = self.params.get("betas", ADAM_DEFAULT_BETAS)
        return float(b1), float(b2)

    @property
    def eps(self) -> float:
        """Adam epsilon (optimizer.params.eps; 1e-8 when absent)."""
        return float(self.params.get("eps", ADAM_DEFAULT_EPS))


@dataclass(frozen=True)
class LRScheduleArgs:
    """Warmup then decay of the learning rate, GPT-NeoX semantics."""

    lr_decay_style: str = option(
        "linear", "Learning-rate decay after warmup: constant, linear, cosine or exponential."
    )
    lr_decay_iters: int | None = option(
        None, "Iterations over which the learning rate decays; null means lr_decay_fraction of "
        "train_iters, or train_iters."
    )
    lr_decay_fraction: float | None = option(
        None, "With lr_decay_iters null: decay over floor(train_iters * lr_decay_fraction)."
    )
    use_checkpoint_lr_scheduler: bool = option(
        False, "On resume, take lr, min_lr, warmup, decay iterations and style from the "
        "checkpoint's scheduler instead of requiring the config to match it."
    )
    override_lr_scheduler: bool = option(
        False, "On resume, take the schedule from the config even where it differs from the "
        "checkpoint's (the step count still comes from the checkpoint)."
    )
    min_lr: float = option(0.0, "Learning rate at the end of decay; at most the optimizer's lr.")
    warmup: float = option(
        0.01, "Fraction of the decay iterations spent warming up linearly (0.01 = 1 percent; "
        "not rounded, as in GPT-NeoX)."
    )
