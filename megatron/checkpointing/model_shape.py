"""The model shape a checkpoint holds: which fields make it, and how a mismatch is reported.

Two views of the same thing, both owned here:
- `SHAPE_KEYS`: what the manifest's `run` records (the sizes every tensor's shape follows);
  training refuses a checkpoint whose recorded shape differs from its own (A23).
- `ARCHITECTURE_FIELDS`: the ModelConfig fields that must agree between a run config and a
  checkpoint's saved config before its weights are used for generation, eval, export or
  import; the rest (seq_length, dropout, init, seed, softmax precision) may differ there.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
              "intermediate_size", "padded_vocab_size", "moe_num_experts", "moe_expert_interval",
              "mamba_layers", "mamba_inner_size")
# what a manifest written before a key existed means by its absence
SHAPE_DEFAULTS = {"moe_num_experts": 1, "moe_expert_interval": 1, "mamba_layers": [],
                  "mamba_inner_size": 0}

ARCHITECTURE_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "intermediate_size",
    "pos_emb", "rotary_pct", "rotary_emb_base", "norm", "norm_epsilon", "activation",
    "tied_embeddings", "gpt_j_residual", "gpt_j_tied", "use_bias_in_norms",
    "use_bias_in_attn_linear", "use_bias_in_mlp",
    "layer_attention",  # a property: attention_config and sliding_window_width by their effect
    "gelu_approximation",  # a property: bias_gelu_fusion with activation gelu
    "moe_num_experts", "moe_expert_interval", "moe_top_k", "moe_router_type",
    "moe_normalize_topk", "mamba_inner_size", "mamba_use_bias_in_conv",
    "mamba_use_bias_in_linears",
)
# fields a model of Mamba layers only does not use (no attention, no MLP), and those a model
# without rotary positions does not use: not compared there
TRANSFORMER_FIELDS = frozenset({
    "num_attention_heads", "num_kv_heads", "intermediate_size", "activation", "gpt_j_residual",
    "gpt_j_tied", "use_bias_in_attn_linear", "use_bias_in_mlp", "gelu_approximation"})
ROTARY_FIELDS = frozenset({"rotary_pct", "rotary_emb_base"})
# how the sinusoidal position table is laid out (pos_emb: sinusoidal), recorded in the manifest
POSITION_TABLE = "sines then cosines"
# how a mismatch names a field that is not a config key of its own
FIELD_LABELS = {"gelu_approximation": "GELU approximation (bias_gelu_fusion)",
                "layer_attention": "attention (attention_config, sliding_window_width)"}


def describe_shape(args, padded_vocab_size: int | None) -> dict:
    """The manifest's shape keys for the run config `args` (its model section and derived
    values) with the embedding's padded vocabulary."""
    m, d = args.model, args.derived
    return {"num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads, "num_kv_heads": d.num_kv_heads,
            "intermediate_size": d.intermediate_size, "padded_vocab_size": padded_vocab_size,
            "moe_num_experts": m.moe_num_experts, "moe_expert_interval": m.moe_expert_interval,
            **mamba_shape(d.attention_types, d.mamba_inner_size),
            "value_head": args.training.train_impl == "rm",
            **({"position_table": POSITION_TABLE} if m.pos_emb == "sinusoidal" else {})}


def position_table_warning(pos_emb: str | None, run: dict, where) -> str | None:
    """The warning for a checkpoint of sinusoidal positions written before its manifest recorded
    the table's layout: those versions interleaved sines and cosines, this one lays the table
    out as GPT-NeoX does (every sine, then every cosine). None for any other checkpoint."""
    if pos_emb != "sinusoidal" or run.get("position_table") == POSITION_TABLE:
        return None
    return (f"checkpoint {where} was trained with pos_emb: sinusoidal by an earlier version of "
            "this project, whose position table interleaved sines and cosines; this version "
            "lays it out as GPT-NeoX does (every sine, then every cosine), so the model now sees "
            "other position signals than it learned: fine-tune it for a while, or generate and "
            "evaluate it with the version that trained it")


def mamba_shape(attention_types, inner_size: int) -> dict:
    """The shape keys of Mamba layers: which layers (0-based) and their channels (0: none)."""
    layers = [i for i, kind in enumerate(attention_types) if kind == "mamba"]
    return {"mamba_layers": layers, "mamba_inner_size": inner_size if layers else 0}


def head_change(saved: dict, current: dict, finetune: bool, where) -> bool:
    """Whether the checkpoint's language-model head gives way to this run's value head (a
    reward model fine-tuned from a language model: the head starts fresh). ValueError for
    the changes that cannot load: a reward model into a language model, or a language model
    into a reward model without finetune."""
    was, now = bool(saved.get("value_head")), bool(current.get("value_head"))
    if was == now:
        return False
    if was:
        raise ValueError(f"checkpoint {where} is a reward model (train_impl rm: a value head, no "
                         "LM head) and cannot be loaded as a language model; load it with "
                         "train_impl: rm, or load a language-model checkpoint")
    if not finetune:
        raise ValueError(f"checkpoint {where} is a language model; a reward model starts from one "
                         "with finetune: true (its LM head is left out and the value head starts "
                         "fresh)")
    return True


def reward_model_refusal(where, what: str) -> str:
    """Why a reward model's checkpoint cannot serve `what`, which needs next-token logits."""
    return (f"checkpoint {where} is a reward model (train_impl rm: a value head in place of the "
            f"LM head); {what} needs a language model: load the checkpoint the reward model was "
            "trained from, or a policy checkpoint")


def resumed_vocab(default: int, saved: int | None, tp: int, token_ids: int, where) -> int:
    """The padded vocabulary of a run that loads the checkpoint `where`: its own (saved) size,
    whatever tensor-parallel degree wrote it, when this run's degree `tp` divides it; `default`
    (make_vocab_size_divisible_by x tp) when the checkpoint records none. ValueError when `tp`
    does not divide it, or when it has fewer rows than the tokenizer has ids."""
    if saved is None or saved == default:
        return default
    if saved < token_ids:
        raise ValueError(f"checkpoint {where} embeds {saved} vocabulary rows but the tokenizer "
                         f"has {token_ids} ids: use the tokenizer the checkpoint was trained with")
    if saved % tp:
        raise ValueError(f"checkpoint {where} embeds a padded vocabulary of {saved} rows, which "
                         f"model_parallel_size {tp} cannot split into equal parts; use a "
                         f"model_parallel_size that divides {saved} (e.g. the one it was saved "
                         "with)")
    return saved


def vocab_for_run(load: str | None, iteration: int | None, default: int, tp: int,
                  token_ids: int) -> int:
    """The padded vocabulary a training run builds its model with: `default` for a new run,
    the one of the checkpoint it will load from `load` otherwise (resumed_vocab)."""
    from megatron.checkpointing.locate import planned_manifest

    manifest = planned_manifest(Path(load), iteration) if load else None
    if manifest is None:
        return default
    where = Path(load) / manifest.tag
    return resumed_vocab(default, manifest.run.get("padded_vocab_size"), tp, token_ids, where)


# how a mismatch names a shape key that is not a config key of its own
SHAPE_LABELS = {"mamba_layers": "mamba layers (attention_config)",
                "mamba_inner_size": "mamba channels (intermediate_size)"}


def shape_mismatches(saved: dict, current: dict) -> list[str]:
    """`key: checkpoint X, this run Y` for each recorded shape key that differs."""
    out = []
    for key in SHAPE_KEYS:
        a, b = saved.get(key, SHAPE_DEFAULTS.get(key)), current.get(key)
        if a is not None and b is not None and a != b:
            out.append(f"{SHAPE_LABELS.get(key, key)}: checkpoint {a}, this run {b}")
    return out


def compared_fields(a, b) -> tuple[str, ...]:
    """The ARCHITECTURE_FIELDS that matter for two ModelConfigs (see TRANSFORMER_FIELDS)."""
    skip = set()
    if set(a.attention_types) == set(b.attention_types) == {"mamba"}:
        skip |= TRANSFORMER_FIELDS
    if a.pos_emb != "rotary" and b.pos_emb != "rotary":
        skip |= ROTARY_FIELDS
    if a.num_layers != b.num_layers:  # per-layer attention differs then; num_layers says why
        skip.add("layer_attention")
    return tuple(n for n in ARCHITECTURE_FIELDS if n not in skip)


def field_text(name: str, value) -> str:
    """An architecture field's value as a mismatch shows it; `layer_attention` as runs of
    layers: '2 x all earlier keys, 2 x mamba', '32 x 4097 keys'."""
    if name != "layer_attention":
        return repr(value)
    runs: list[list] = []
    for kind in value:
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    names = {None: "all earlier keys", "mamba": "mamba"}
    return ", ".join(f"{n} x {names.get(kind, f'{kind} keys')}" for kind, n in runs)


def architecture_mismatches(run, saved) -> list[str]:
    """`key: run value vs checkpoint value` for every architecture field of two ModelConfigs
    that differs."""
    names = {f.name for f in fields(type(run))}
    out = []
    for name in compared_fields(run, saved):
        assert name in names or hasattr(run, name), name
        a, b = getattr(run, name), getattr(saved, name)
        if a != b:
            out.append(f"{FIELD_LABELS.get(name, name)}: {field_text(name, a)} in this run's "
                       f"config vs {field_text(name, b)} in the checkpoint's")
    if saved.pos_emb == "learned" and run.max_position_embeddings != saved.max_position_embeddings:
        out.append(f"max_position_embeddings (learned position table): "
                   f"{run.max_position_embeddings} vs {saved.max_position_embeddings}")
    return out


def check_architecture(run, saved, step_dir: Path) -> None:
    """Refuse a run config whose model differs from the checkpoint's (a clear error, not a
    shape mismatch deep inside load_state_dict)."""
    problems = architecture_mismatches(run, saved)
    if problems:
        raise ValueError(f"the model in this config differs from the checkpoint {step_dir} ("
                         + "; ".join(problems) + "); use the model config the checkpoint was "
                         "trained with")
