"""Checkpoint directories as GPT-NeoX writes them, built from Hugging Face models in tests.

Written from GPT-NeoX's own conventions, apart from megatron/checkpointing/neox_format.py, so a
test that compares logits with the HF model checks the reader against GPT-NeoX rather than
against itself:
- layer indices (GPT2ModelPipe's specs): 0 embedding, 1 a function, 2..L+1 transformer layers,
  L+2 a function, L+3 final norm (NormPipe: `norm.*`), L+4 output (`final_linear.weight`)
- tensor rank r holds rows r of column-parallel weights (QKV, linear1, the vocabulary) and
  columns r of row-parallel ones (attention.dense, linear2); norms and row-parallel biases whole
- QKV without grouped-query attention: HF GPTNeoX's interleaved [q, k, v] per head, chunked
  by rank; with it (tools/ckpts/convert_hf_llama_to_neox.py): per rank [q_r; k_r; v_r]
- Llama's linear1 per rank [up_r; gate_r] (ParallelMLP's Gated_Activation: act(gate) * up);
  RMSNorm's weight is `scale`
- pipeline models: one `layer_<II>-model_<TT>-model_states.pt` per layer and rank plus
  `mp_rank_<TT>_model_states.pt` (client state, module None); sequential models: the module in
  `mp_rank_<TT>_model_states.pt` as `sequential.<II>.<path>`
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from megatron.model.hf_mapping import rope_of


def _rows(t: torch.Tensor, tp: int, r: int) -> torch.Tensor:
    return t.chunk(tp, dim=0)[r].clone()


def _cols(t: torch.Tensor, tp: int, r: int) -> torch.Tensor:
    return t.chunk(tp, dim=1)[r].clone()


def llama_layers(hf, tp: int, rank: int) -> dict[int, dict[str, torch.Tensor]]:
    """One tensor rank's GPT-NeoX layers of an HF LlamaForCausalLM (untied)."""
    m, L = hf.model, hf.config.num_hidden_layers
    out = {0: {"word_embeddings.weight": _rows(m.embed_tokens.weight, tp, rank)}}
    for i, layer in enumerate(m.layers):
        a, f = layer.self_attn, layer.mlp
        out[i + 2] = {
            "input_layernorm.scale": layer.input_layernorm.weight.clone(),
            "attention.query_key_value.weight": torch.cat(
                [_rows(p.weight, tp, rank) for p in (a.q_proj, a.k_proj, a.v_proj)]),
            "attention.dense.weight": _cols(a.o_proj.weight, tp, rank),
            "post_attention_layernorm.scale": layer.post_attention_layernorm.weight.clone(),
            "mlp.linear1.weight": torch.cat([_rows(f.up_proj.weight, tp, rank),
                                             _rows(f.gate_proj.weight, tp, rank)]),
            "mlp.linear2.weight": _cols(f.down_proj.weight, tp, rank),
        }
    out[L + 3] = {"norm.scale": m.norm.weight.clone()}
    out[L + 4] = {"final_linear.weight": _rows(hf.lm_head.weight, tp, rank)}
    return out


def gpt_neox_layers(hf, tp: int, rank: int, legacy: bool = True) -> dict[int, dict]:
    """One tensor rank's GPT-NeoX layers of an HF GPTNeoXForCausalLM (untied); `legacy`: the
    MLP names of older GPT-NeoX (Pythia's), else linear1/linear2. Rotary inv_freq buffers are
    included, as older GPT-NeoX saved them."""
    m, L = hf.gpt_neox, hf.config.num_hidden_layers
    up, down = ("dense_h_to_4h", "dense_4h_to_h") if legacy else ("linear1", "linear2")
    out = {0: {"word_embeddings.weight": _rows(m.embed_in.weight, tp, rank)}}
    head_dim = hf.config.hidden_size // hf.config.num_attention_heads
    theta, pct, _ = rope_of(hf.config)
    rot = int(head_dim * pct)
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2).float() / rot))
    for i, layer in enumerate(m.layers):
        a, f = layer.attention, layer.mlp
        out[i + 2] = {
            "input_layernorm.weight": layer.input_layernorm.weight.clone(),
            "input_layernorm.bias": layer.input_layernorm.bias.clone(),
            "post_attention_layernorm.weight": layer.post_attention_layernorm.weight.clone(),
            "post_attention_layernorm.bias": layer.post_attention_layernorm.bias.clone(),
            "attention.query_key_value.weight": _rows(a.query_key_value.weight, tp, rank),
            "attention.query_key_value.bias": _rows(a.query_key_value.bias, tp, rank),
            "attention.rotary_emb.inv_freq": inv_freq,
            "attention.dense.weight": _cols(a.dense.weight, tp, rank),
            "attention.dense.bias": a.dense.bias.clone(),
            f"mlp.{up}.weight": _rows(f.dense_h_to_4h.weight, tp, rank),
            f"mlp.{up}.bias": _rows(f.dense_h_to_4h.bias, tp, rank),
            f"mlp.{down}.weight": _cols(f.dense_4h_to_h.weight, tp, rank),
            f"mlp.{down}.bias": f.dense_4h_to_h.bias.clone(),
        }
    out[L + 3] = {"norm.weight": m.final_layer_norm.weight.clone(),
                  "norm.bias": m.final_layer_norm.bias.clone()}
    out[L + 4] = {"final_linear.weight": _rows(hf.get_output_embeddings().weight, tp, rank)}
    return out


def mamba_layers(hf, tp: int, rank: int) -> dict[int, dict[str, torch.Tensor]]:
    """The GPT-NeoX layers of an HF MambaForCausalLM (untied), tensor-parallel 1: its
    ParallelMambaResidualLayerPipe holds `norm` (RMSNorm: `scale`) and `mixer`, whose
    parameters carry mamba_ssm's names, as HF's do."""
    if tp != 1:
        raise ValueError("GPT-NeoX's Mamba layers are only read at tensor-parallel 1")
    m, L = hf.backbone, hf.config.num_hidden_layers
    out = {0: {"word_embeddings.weight": m.embeddings.weight.clone()}}
    order = ("A_log", "D", "in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias",
             "x_proj.weight", "dt_proj.weight", "dt_proj.bias", "out_proj.weight",
             "out_proj.bias")  # ParallelMambaBlock's state_dict order
    for i, layer in enumerate(m.layers):
        mixer = layer.mixer.state_dict()
        out[i + 2] = {"norm.scale": layer.norm.weight.clone()} | {
            f"mixer.{name}": mixer[name].clone() for name in order if name in mixer}
    out[L + 3] = {"norm.scale": m.norm_f.weight.clone()}
    out[L + 4] = {"final_linear.weight": hf.lm_head.weight.clone()}
    return out


def moe_layers(canonical: dict[str, torch.Tensor], num_layers: int, tp: int, rank: int
               ) -> dict[int, dict[str, torch.Tensor]]:
    """One tensor rank's GPT-NeoX layers of a model of ours with mixture-of-experts layers
    (layer norms, rotary attention without grouped queries, untied), as GPT-NeoX's
    ParallelDroplessMoE holds them: the router `mlp.router.layer.weight` [E, h] whole; the
    rank's contiguous block of n = E / tp experts as `mlp.experts.mlp.w1` and `.w2`, each
    [n f, h] (ParallelGroupedMLP views them [n, f, h]; expert e is act(x w1_e^T) w2_e)."""
    out = {0: {"word_embeddings.weight": _rows(canonical["0.word_embeddings.weight"], tp, rank)}}
    for i in range(num_layers):
        ours = {k.split(".", 1)[1]: v for k, v in canonical.items()
                if k.split(".", 1)[0] == str(i + 1)}
        layer = {f"{norm}.{p}": ours[f"{norm}.{p}"].clone()
                 for norm in ("input_layernorm", "post_attention_layernorm")
                 for p in ("weight", "bias")}
        layer |= {"attention.query_key_value.weight":
                  _rows(ours["attention.query_key_value.weight"], tp, rank),
                  "attention.query_key_value.bias":
                  _rows(ours["attention.query_key_value.bias"], tp, rank),
                  "attention.dense.weight": _cols(ours["attention.dense.weight"], tp, rank),
                  "attention.dense.bias": ours["attention.dense.bias"].clone()}
        if "mlp.router.weight" in ours:
            w_in = _rows(ours["mlp.experts.w_in"], tp, rank)  # [n, f, h]
            w_out = _rows(ours["mlp.experts.w_out"], tp, rank)  # [n, h, f]
            layer |= {"mlp.router.layer.weight": ours["mlp.router.weight"].clone(),
                      "mlp.experts.mlp.w1": w_in.reshape(-1, w_in.shape[2]),
                      "mlp.experts.mlp.w2": w_out.transpose(1, 2).reshape(-1, w_out.shape[1])}
        else:
            layer |= {"mlp.linear1.weight": _rows(ours["mlp.dense_h_to_4h.weight"], tp, rank),
                      "mlp.linear1.bias": _rows(ours["mlp.dense_h_to_4h.bias"], tp, rank),
                      "mlp.linear2.weight": _cols(ours["mlp.dense_4h_to_h.weight"], tp, rank),
                      "mlp.linear2.bias": ours["mlp.dense_4h_to_h.bias"].clone()}
        out[i + 2] = layer
    L = num_layers
    out[L + 3] = {f"norm.{p}": canonical[f"{L + 1}.norm.{p}"].clone() for p in ("weight", "bias")}
    out[L + 4] = {"final_linear.weight": _rows(canonical[f"{L + 2}.weight"], tp, rank)}
    return out


def write_neox_checkpoint(root: Path, layers_of, tp: int, shape: str, iteration: int,
                          args: dict | None = None, configs: dict[str, dict] | None = None,
                          tag: str | None = None) -> Path:
    """Write `<root>/<tag>/` (default global_step<iteration>) and `<root>/latest` as GPT-NeoX
    does; `layers_of(rank)` gives a rank's layers; `shape` "pipeline" or "sequential";
    `args`: the client state's "args" (GPT-NeoX's training saves them, its converters not);
    `configs`: file name -> config written to configs/."""
    tag = tag or f"global_step{iteration}"
    step = Path(root) / tag
    step.mkdir(parents=True)
    for rank in range(tp):
        layers = layers_of(rank)
        state = {"iteration": iteration, "dp_world_size": 1, "mp_world_size": tp,
                 "global_steps": iteration, "skipped_steps": 0, "optimizer": {}}
        if args is not None:
            state["args"] = args
        if shape == "pipeline":
            for index, tensors in layers.items():
                torch.save(tensors, step / f"layer_{index:02d}-model_{rank:02d}-model_states.pt")
            state["module"] = None
        else:
            state["module"] = {f"sequential.{i}.{p}": t for i, ts in layers.items()
                               for p, t in ts.items()}
        torch.save(state, step / f"mp_rank_{rank:02d}_model_states.pt")
    for name, config in (configs or {}).items():
        (step / "configs").mkdir(exist_ok=True)
        (step / "configs" / name).write_text(yaml.safe_dump(config))
    (Path(root) / "latest").write_text(tag)
    return step


class LayerNorm(torch.nn.Module):
    """A parameter holder GPT-NeoX's optimizer grouping recognises as a norm (by class name)."""


class RMSNorm(torch.nn.Module):
    """As LayerNorm."""


class NeoXLayer(torch.nn.Module):
    """One GPT-NeoX layer's tensors under GPT-NeoX's names (a stand-in for its modules); its
    forward adds 0.5 * sum(p^2) of its parameters, so each parameter's gradient is itself."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        for path, tensor in tensors.items():
            *modules, leaf = path.split(".")
            owner = self
            for name in modules:
                if not hasattr(owner, name):
                    kind = RMSNorm if path.endswith(".scale") else (
                        LayerNorm if "layernorm" in name or name == "norm" else torch.nn.Module)
                    owner.add_module(name, kind())
                owner = getattr(owner, name)
            if leaf == "inv_freq":
                owner.register_buffer(leaf, tensor.clone())
            else:
                owner.register_parameter(leaf, torch.nn.Parameter(tensor.clone().float()))
                if leaf in ("A_log", "D"):  # as GPT-NeoX's ParallelMambaBlock marks them
                    getattr(owner, leaf)._no_weight_decay = True

    def forward(self, x):
        return x + 0.5 * sum((p.float() ** 2).sum() for p in self.parameters())


def _passthrough(x):
    return x


def neox_weight_decay_groups(module) -> list[dict]:
    """GPT-NeoX's get_params_for_weight_decay_optimization, by its rule: modules in order; a
    norm's parameters, every bias and parameters marked _no_weight_decay go without decay, the
    rest with it."""
    decay, no_decay = [], []
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is None:
                continue
            norm = type(m).__name__ in ("LayerNorm", "RMSNorm")
            exempt = norm or name == "bias" or getattr(p, "_no_weight_decay", False)
            (no_decay if exempt else decay).append(p)
    return [{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}]


def deepspeed_neox_checkpoint(root: Path, layers: dict[int, dict], zero_stage: int,
                              iteration: int, lr: float, args: dict, configs: dict,
                              lr_scheduler=None) -> Path:
    """GPT-NeoX's layers (one tensor rank, one pipeline stage) as a real DeepSpeed pipeline
    engine with GPT-NeoX's optimizer groups, after one Adam step, saved by DeepSpeed itself
    as GPT-NeoX saves (client state iteration and args, configs/ beside it). Call inside an
    initialised one-process torch.distributed group."""
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    L = max(layers) - 4
    specs = [NeoXLayer(layers[0]), _passthrough,
             *[NeoXLayer(layers[i]) for i in range(2, L + 2)], _passthrough,
             NeoXLayer(layers[L + 3]), NeoXLayer(layers[L + 4])]
    topology = PipeModelDataParallelTopology(num_pp=1, num_mp=1, num_dp=1)  # GPT-NeoX's axes
    module = PipelineModule(layers=specs, topology=topology, partition_method="uniform",
                            loss_fn=lambda out, label: out.sum())
    optimizer = torch.optim.Adam(neox_weight_decay_groups(module), lr=lr, betas=(0.9, 0.95),
                                 eps=1e-8)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": zero_stage}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": 0.0, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config,
                                      lr_scheduler=lr_scheduler)
    data = iter([(torch.zeros(1, 1), torch.zeros(1, 1))])
    engine.train_batch(data)
    tag = f"global_step{iteration}"
    engine.save_checkpoint(str(root), tag=tag, client_state={"iteration": iteration,
                                                               "args": args})
    for name, config_data in configs.items():
        (Path(root) / tag / "configs").mkdir(exist_ok=True)
        (Path(root) / tag / "configs" / name).write_text(yaml.safe_dump(config_data))
    return Path(root) / tag
