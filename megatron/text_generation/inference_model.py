"""`InferenceModel`: the non-pipelined GPTModel set up for generation and eval, behind one forward.

    model = InferenceModel.from_canonical(config, canonical_weights, tp, device, dtype)
    with torch.inference_mode():
        local = model.forward(tokens, positions)          # [b, s, V/tp], this rank's slice
        last = model.last_logits(tokens, positions)       # [b, V] fp32, gathered over tp

It holds the model in eval mode and checks at every forward that it still is and that the call
runs under `torch.inference_mode()` (A25). Vocabulary rows the checkpoint does not have (padding
added for this run's tensor-parallel degree) get logit -inf.
"""

from __future__ import annotations

import torch

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.model.kv_cache import KVCache
from megatron.model.partition import Sharding
from megatron.model.precision import to_dtype
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.mappings import gather_from_tensor_parallel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class InferenceModel:
    """A GPTModel in eval mode on one device, with the vocabulary limits generation needs.

    `trained_vocab`: rows the checkpoint has (log-probs are normalised over them);
    `token_limit`: ids at or above it are never sampled (they have no text).
    """

    def __init__(self, model: GPTModel, tp: TensorParallel, trained_vocab: int, token_limit: int):
        self.model = model.eval()
        self.config: ModelConfig = model.config
        self.tp = tp
        self.trained_vocab = trained_vocab
        self.token_limit = min(token_limit, trained_vocab)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.per_rank_vocab = self.config.padded_vocab_size // tp.size
        self.vocab_start = tp.rank * self.per_rank_vocab

    @classmethod
    def from_canonical(cls, config: ModelConfig, canonical: dict[str, torch.Tensor],
                       tp: TensorParallel = NO_TP, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32, token_limit: int | None = None,
                       trained_vocab: int | None = None) -> "InferenceModel":
        """Build the model for `tp` and load canonical full weights (config.padded_vocab_size
        rows); `trained_vocab`: rows that came from the checkpoint (default: all of them)."""
        trained = trained_vocab or int(canonical["0.word_embeddings.weight"].shape[0])
        model = GPTModel(config, tp)
        state = Sharding.for_model(config).shard_model(canonical, tp)
        model.load_state_dict(state, strict=True)
        to_dtype(model, dtype, device)  # Mamba's A and D stay fp32 where marked
        return cls(model, tp, trained, trained if token_limit is None else token_limit)

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    def check_inference_state(self) -> None:
        """A25: refuse to run in training mode or with autograd recording."""
        if self.model.training:
            raise RuntimeError("the model is in training mode (dropout on); generation and eval "
                               "need model.eval() (A25)")
        if not torch.is_inference_mode_enabled():
            raise RuntimeError("generation and eval must run under torch.inference_mode() (A25)")

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """tokens, positions [b, s] -> this rank's logits slice [b, s, V/tp] (model dtype)."""
        self.check_inference_state()
        logits = self.model(tokens.to(self.device), positions.to(self.device), mask, kv_cache)
        if self.trained_vocab < self.config.padded_vocab_size:
            first_missing = self.trained_vocab - self.vocab_start
            if first_missing < self.per_rank_vocab:
                logits[..., max(first_missing, 0):] = float("-inf")
        return logits

    def gather_vocab(self, local_logits: torch.Tensor) -> torch.Tensor:
        """[..., V/tp] -> [..., V] in fp32 (every tensor-parallel rank gets the same tensor)."""
        return gather_from_tensor_parallel(local_logits.float().contiguous(), self.tp)

    def agree(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens of tensor-parallel rank 0 on every rank of the group (their logits are
        the same gathered tensor, so this only guards against any divergence)."""
        if self.tp.enabled:
            import torch.distributed as dist

            dist.broadcast(tokens, src=dist.get_global_rank(self.tp.group, 0), group=self.tp.group)
        return tokens

    def new_cache(self, batch: int, max_len: int, key_padding: torch.Tensor | None = None
                  ) -> KVCache:
        """A KV cache for `batch` rows of up to `max_len` positions (this rank's KV heads; a
        recurrent state for Mamba layers)."""
        c = self.config
        mamba = frozenset(i for i in range(c.num_layers) if c.is_mamba_layer(i))
        return KVCache(c.num_layers, batch, max_len, c.num_kv_heads // self.tp.size, c.head_dim,
                       self.dtype, self.device, key_padding, mamba)
