"""A15 for the optimizer and its learning-rate schedule: `optimizer: {type, params}` holds what
the torch optimizer takes, and lr, min_lr, warmup and decay agree. Each rule names the keys,
their values and what to change; a rule about one value yields a `BadValue` at its key path."""

from __future__ import annotations

from typing import Any, Mapping

from .errors import BadValue, ConfigError, Problems
from .registries import check_choice
from .sections.optimization import OPTIMIZER_PARAMS

Config = Mapping[str, Any]


def optimizer_rules(c: Config, world_size: int | None) -> Problems:
    opt = c["optimizer"]
    extra = sorted(set(opt) - {"type", "params"})
    if extra or not isinstance(opt.get("type"), str) or not isinstance(opt.get("params", {}), dict):
        yield BadValue("optimizer", (
            f"optimizer must look like {{type: Adam, params: {{lr: 0.0006, betas: [0.9, 0.95], "
            f"eps: 1.0e-8}}}}; got {opt!r}."
        ))
        return
    try:
        check_choice("optimizer.type", opt["type"])
    except ConfigError as e:
        yield BadValue("optimizer.type", str(e))
    params = opt.get("params") or {}
    lr = params.get("lr", 0.001)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        yield BadValue("optimizer.params.lr",
                       f"optimizer.params.lr({lr!r}) must be a number greater than 0.")
        return
    betas = params.get("betas", [0.9, 0.999])
    if not (isinstance(betas, list) and len(betas) == 2
            and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        yield BadValue("optimizer.params.betas",
                       f"optimizer.params.betas({betas!r}) must be two numbers in [0, 1).")
    eps = params.get("eps", 1e-8)
    if not isinstance(eps, (int, float)) or not eps > 0:
        yield BadValue("optimizer.params.eps",
                       f"optimizer.params.eps({eps!r}) must be a number greater than 0.")
    yield from _optimizer_params(opt["type"], params)
    if "weight_decay" in params:
        yield BadValue("optimizer.params.weight_decay", (
            f"optimizer.params.weight_decay({params['weight_decay']}) would not be used: the "
            f"top-level weight_decay({c['weight_decay']}) decays the matrices. Move the value "
            "to weight_decay (GPT-NeoX stops on this key too: its optimizer receives "
            "weight_decay twice)."))
    yield from _schedule(c, lr)


def _optimizer_params(kind: str, params: dict) -> Problems:
    """optimizer.params: only the keys the type's optimizer takes, each of its type; the values
    the torch optimizers cannot give are refused by name."""
    known = OPTIMIZER_PARAMS.get(kind.lower())
    if known is None:  # a type that is not implemented: refused by its choice
        return
    unknown = sorted(set(params) - set(known) - {"weight_decay"})  # which is refused apart
    for key in unknown:  # one problem each: each may come from another file or override
        yield BadValue(f"optimizer.params.{key}", (
            f"optimizer.params has {key}, which optimizer type {kind} does not take; valid: "
            f"{', '.join(known)}."))
    for key in ("adam_w_mode", "bias_correction", "amsgrad", "set_grad_none", "nesterov"):
        if key in params and not isinstance(params[key], bool):
            yield BadValue(f"optimizer.params.{key}",
                           f"optimizer.params.{key}({params[key]!r}) must be true or false.")
    if params.get("bias_correction") is False:
        yield BadValue("optimizer.params.bias_correction", (
            "optimizer.params.bias_correction(false) is not supported: torch's Adam always "
            "corrects the moments' bias; remove the key."))
    if params.get("amsgrad") is True:
        yield BadValue("optimizer.params.amsgrad", (
            "optimizer.params.amsgrad(true) is not supported (GPT-NeoX's FusedAdam refuses it "
            "too); remove the key."))
    for key in ("momentum", "dampening"):
        value = params.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            yield BadValue(f"optimizer.params.{key}",
                           f"optimizer.params.{key}({value!r}) must be a number in [0, 1].")
    if params.get("nesterov") is True and (params.get("momentum", 0.0) <= 0
                                           or params.get("dampening", 0.0) != 0):
        yield ("optimizer.params.nesterov(true) needs momentum greater than 0 and dampening 0 "
               f"(momentum {params.get('momentum', 0.0)}, dampening "
               f"{params.get('dampening', 0.0)}).")


def _schedule(c: Config, lr: float) -> Problems:
    """The learning-rate schedule around the peak `lr`, and the regularisation keys."""
    if c["min_lr"] > lr:
        yield f"min_lr({c['min_lr']}) > optimizer.params.lr({lr}); min_lr must be at most lr."
    for key in ("min_lr", "weight_decay", "gradient_clipping"):
        if c[key] < 0:
            yield BadValue(key, f"{key}({c[key]}) must be 0 or more.")
    if not 0 <= c["warmup"] <= 1:
        yield BadValue("warmup", f"warmup({c['warmup']}) is a fraction of lr_decay_iters and "
                                 "must be in [0, 1].")
    fraction = c["lr_decay_fraction"]
    if fraction is not None and not 0 < fraction <= 1:
        yield BadValue("lr_decay_fraction", f"lr_decay_fraction({fraction}) is a fraction of "
                                            "train_iters and must be in (0, 1].")
    if c["use_checkpoint_lr_scheduler"] and c["override_lr_scheduler"]:
        yield ("use_checkpoint_lr_scheduler and override_lr_scheduler are both true; choose "
               "one: the checkpoint's learning-rate schedule or the config's.")
