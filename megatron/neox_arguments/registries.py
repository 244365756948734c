"""The named choices a config may pick (attention, norm, activation, ...) and the check for them.

Each registry lists the names this project implements and, separately, the names GPT-NeoX accepts
that this project does not implement yet, so a NeoX config gets "not supported yet" rather than
"unknown". Code that maps a name to an implementation (model, optimizer, scheduler, tokenizer)
keeps its own registry and is tested against the names here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Registry:
    """Valid names for one config key; `neox_only` are GPT-NeoX names not implemented here."""

    key: str
    names: tuple[str, ...]
    neox_only: tuple[str, ...] = ()
    case_sensitive: bool = True

    def canonical(self, value: str) -> str | None:
        """The registered spelling of `value`, or None when it is not a valid name."""
        if value in self.names:
            return value
        if not self.case_sensitive:
            for name in self.names:
                if name.lower() == value.lower():
                    return name
        return None

    def check(self, value: str, where: str = "") -> str:
        """The registered spelling of `value`; `ConfigError` listing the valid names otherwise."""
        found = self.canonical(value)
        if found is not None:
            return found
        valid = ", ".join(self.names)
        at = f" ({where})" if where else ""
        if value in self.neox_only or value.lower() in (n.lower() for n in self.neox_only):
            raise ConfigError(
                f"{self.key} '{value}'{at} is a GPT-NeoX choice this project does not support yet; "
                f"choose one of: {valid}."
            )
        raise ConfigError(
            f"{self.key} '{value}'{at} is not a valid choice; choose one of: {valid}."
        )


INIT_METHODS = (
    "normal", "scaled_normal", "orthogonal", "scaled_orthogonal",
    "xavier_uniform", "xavier_normal", "wang_init", "small_init", "single_residual_scaled_normal",
)

GATED_ACTIVATIONS = ("geglu", "swiglu", "reglu")

REGISTRIES: dict[str, Registry] = {
    r.key: r
    for r in (
        Registry("pos_emb", ("learned", "rotary", "sinusoidal", "alibi", "none"), ("rpe",)),
        Registry("norm", ("layernorm", "rmsnorm", "scalenorm"), ("te_layernorm", "te_rmsnorm")),
        Registry(
            "activation",
            ("gelu", "relu", "silu") + GATED_ACTIVATIONS,
            ("softsign", "swish", "mish", "bilinear", "glu"),
        ),
        Registry("init_method", INIT_METHODS, ()),
        Registry("output_layer_init_method", INIT_METHODS, ()),
        Registry(
            "attention_config",
            ("global", "local", "flash", "mamba"),
            ("sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "gmlp", "amlp",
             "rwkv"),
        ),
        Registry("output_layer_parallelism", ("column",), ("row",)),
        Registry("lr_decay_style", ("constant", "linear", "cosine", "exponential"), ()),
        Registry("bad_step_policy", ("skip", "stop", "rollback"), ()),
        Registry(
            "optimizer.type",
            ("Adam", "AdamW", "SGD"),
            ("Lamb", "OneBitAdam", "OneBitLamb", "CPU_Adam", "cpu_torch_adam", "madgrad_wd",
             "sm3", "lion"),
            case_sensitive=False,
        ),
        Registry(
            "tokenizer_type",
            ("GPT2BPETokenizer", "HFGPT2Tokenizer", "HFTokenizer", "SPMTokenizer",
             "CharLevelTokenizer", "TiktokenTokenizer"),
            case_sensitive=False,
        ),
        Registry("text_gen_type", ("unconditional", "input-file", "interactive"), ("precompute",)),
        Registry(
            "launcher",
            ("pdsh", "openmpi", "mvapich", "slurm", "jsrun", "mpich", "impi"),
        ),
        Registry("checkpoint_scale", ("linear", "log")),
        Registry("train_impl", ("normal", "dpo", "kto", "rm"), ("reinforce",)),
        Registry("dataset_impl", ("gpt2", "pairwise"), ("online",)),
        Registry("pack_impl", ("packed", "pack_until_overflow", "unpacked")),
        Registry("distributed_backend", ("auto", "nccl", "gloo")),
        Registry("cpu_matmul_precision", ("auto", "fp32", "native")),
        Registry("moe_router_type", ("sinkhorn", "topk")),
        Registry("data_impl", ("mmap", "infer"), ("cached",)),
        Registry("data_fingerprint", ("sampled", "full")),
        Registry("precision", ("fp32", "fp16", "bf16", "bfloat16")),
        Registry("log_level", ("debug", "info", "warning", "error"), case_sensitive=False),
    )
}

# Keys whose value is rewritten to the registered spelling at load time (NeoX compares them
# case-insensitively, so "adam" and "hftokenizer" appear in the wild).
CANONICALISED_KEYS = ("tokenizer_type", "log_level")

PIPE_PARTITION_METHODS = ("parameters", "uniform", "type:<regex>")


def check_choice(key: str, value: str, where: str = "") -> str:
    """The registered spelling of `value` for `key`, or `ConfigError` listing the valid names."""
    return REGISTRIES[key].check(value, where)
