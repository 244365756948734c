"""The GPT model: one function builds layer specs; they become a PipelineModule or a plain module.

Layer order: embedding -> num_layers transformer layers (Mamba layers where attention_config
says `mamba`) -> final norm -> LM head (a separate
linear, or the input embedding's weight when `tied_embeddings`; a reward model's value head
instead, `value_head`). Every layer passes the tuple
(hidden [b, s, h], position_ids [b, s], mask) to the next, where `mask` is a [b, 1, s, s]
boolean keep-mask when documents are masked from each other, else a 1-element placeholder.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron.model.block import TransformerLayer, TransformerLayerPipe, unpack_mask
from megatron.model.embedding import EmbeddingPipe, tied_lm_head
from megatron.model.fusions import cross_entropy
from megatron.model.init import init_methods, layer_generator
from megatron.model.mamba import MambaLayer, MambaLayerPipe
from megatron.model.norms import build_norm
from megatron.model.recompute import Recompute
from megatron.model.value_head import ValueHead
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import ColumnParallelLinear, mark_sequence_parallel


BLOCKS = (TransformerLayerPipe, MambaLayerPipe)  # the num_layers layers between embedding and norm


class FinalNormPipe(nn.Module):
    """The final norm; drops position ids and mask from the pipeline tuple."""

    def __init__(self, config, tp: TensorParallel = NO_TP):
        super().__init__()
        self.norm = build_norm(config)
        mark_sequence_parallel(self.norm, tp)

    def forward(self, inputs):
        hidden, _position_ids, _mask = inputs
        return self.norm(hidden)


class LMHead(ColumnParallelLinear):
    """Untied output projection hidden [b, s, h] -> this rank's logits slice [b, s, V/tp]."""

    def __init__(self, config, tp: TensorParallel = NO_TP):
        init_fn, _ = init_methods(config)
        super().__init__(config.hidden_size, config.padded_vocab_size, init_fn,
                         layer_generator(config.seed, config.num_layers + 1), tp, bias=False,
                         fp32_products=config.fp32_products)


def build_layer_specs(config, tp: TensorParallel = NO_TP) -> list:
    """The model as DeepSpeed layer specs; the single source for every way the model is built."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    if tp.sequence_parallel and config.seq_length % tp.size:
        raise ValueError(f"sequence_parallel splits the sequence over tensor-parallel ranks: "
                         f"seq_length({config.seq_length}) must be divisible by "
                         f"model_parallel_size({tp.size})")
    if config.value_head:  # a reward model: no LM head, so nothing is tied to the embedding
        embed, head = LayerSpec(EmbeddingPipe, config, tp), LayerSpec(ValueHead, config, tp)
    elif config.tied_embeddings:
        embed = TiedLayerSpec("embed", EmbeddingPipe, config, tp,
                              tied_weight_attr="word_embeddings.weight")
        head = TiedLayerSpec("embed", EmbeddingPipe, config, tp, forward_fn=tied_lm_head,
                             tied_weight_attr="word_embeddings.weight")
    else:
        embed, head = LayerSpec(EmbeddingPipe, config, tp), LayerSpec(LMHead, config, tp)
    blocks = [LayerSpec(MambaLayerPipe if config.is_mamba_layer(i) else TransformerLayerPipe,
                        config, i, tp) for i in range(config.num_layers)]
    return [embed, *blocks, LayerSpec(FinalNormPipe, config, tp), head]


def lm_loss(logits: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor],
            tp: TensorParallel = NO_TP) -> torch.Tensor:
    """Mean next-token cross entropy over positions where loss_mask is 1, computed in fp32.

    `logits` may be this rank's vocabulary slice; the full logits are never gathered.
    """
    labels, loss_mask = targets  # [b, s], [b, s]
    losses = cross_entropy(logits, labels, tp)  # [b, s]
    mask = loss_mask.float()
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


class LMLoss:
    """lm_loss bound to a tensor-parallel view: the loss_fn handed to DeepSpeed's pipeline."""

    def __init__(self, tp: TensorParallel = NO_TP):
        self.tp = tp
        self.__name__ = "lm_loss"

    def __call__(self, logits, targets):
        return lm_loss(logits, targets, self.tp)


class GPTModel(nn.Module):
    """The non-pipelined model built from the same specs (pipe_parallel_size 0, generation, eval).

    With `recompute` (activation checkpointing) each group of `recompute.num_layers`
    consecutive transformer layers is one checkpoint while training.
    """

    def __init__(self, config, tp: TensorParallel = NO_TP, recompute: Recompute | None = None):
        super().__init__()
        self.config = config
        self.recompute = recompute
        tied: dict[str, nn.Module] = {}
        self.layers = nn.ModuleList()
        self._calls = []  # (forward_fn or None, module) in spec order
        for spec in build_layer_specs(config, tp):
            key = getattr(spec, "key", None)
            if key is not None and key in tied:
                self._calls.append((spec.forward_fn, tied[key]))
                continue
            module = spec.build()
            if key is not None:
                tied[key] = module
            self._calls.append((None, module))
            self.layers.append(module)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor | None = None, kv_cache=None) -> torch.Tensor:
        """tokens [b, s] -> logits [b, s, padded_vocab / tp].

        With `kv_cache` (a KVCache), `tokens` are only the new tokens after the cached ones;
        the cache is extended by them.
        """
        if mask is None:
            mask = torch.zeros(1, dtype=torch.bool, device=tokens.device)
        x = (tokens, position_ids, mask)
        recompute = self.recompute if (self.training and kv_cache is None) else None
        block, group = 0, []  # group: transformer layers waiting to run as one checkpoint
        for forward_fn, module in self._calls:
            if recompute is not None and isinstance(module, BLOCKS):
                group.append(module)
                if len(group) == recompute.num_layers:
                    x, group = recompute(_run_layers(group), *x), []
                continue
            if group:
                x, group = recompute(_run_layers(group), *x), []
            if forward_fn is not None:
                x = forward_fn(module, x)
            elif isinstance(module, BLOCKS) and kv_cache is not None:
                hidden, pos, m = x
                run = MambaLayer.forward if isinstance(module, MambaLayer) else TransformerLayer.forward
                x = (run(module, hidden, pos, unpack_mask(m), kv_cache.layer(block)), pos, m)
                block += 1
            else:
                x = module(x)
        if kv_cache is not None:
            kv_cache.advance(tokens.shape[1])
        return x


def _run_layers(layers: list[nn.Module]):
    """The pipeline tuple through `layers` in order: the function one checkpoint recomputes."""
    def run(*inputs):
        for layer in layers:
            inputs = layer(inputs)
        return inputs
    return run


def build_pipeline_model(config, topology, partition_method: str,
                         recompute: Recompute | None = None, tp: TensorParallel = NO_TP,
                         loss_fn=None):
    """The model as a DeepSpeed PipelineModule over `topology` (a PipeModelDataParallelTopology)
    whose last stage computes `loss_fn(output, targets)` (default: the language-model loss).

    With `recompute`, DeepSpeed checkpoints each run of `recompute.num_layers` consecutive
    layers of a stage; a run that holds a layer other than a transformer layer (embedding,
    final norm, head) is not checkpointed.
    """
    from deepspeed.pipe import PipelineModule

    # no_grad: DeepSpeed broadcasts tied weights (the embedding and a tied head on other stages)
    # in place while building the module; under autograd that records a broadcast node the
    # backward then warns about on every rank
    with torch.no_grad():
        return PipelineModule(
            layers=build_layer_specs(config, tp),
            topology=topology,
            loss_fn=loss_fn if loss_fn is not None else LMLoss(tp),
            partition_method=partition_method,
            activation_checkpoint_interval=recompute.num_layers if recompute is not None else 0,
            activation_checkpoint_func=recompute if recompute is not None else Recompute(1, tp),
            # the embedding layer must not be checkpointed (its int inputs carry no grad)
            checkpointable_layers=["TransformerLayerPipe", "MambaLayerPipe"],
        )
