"""Memory one worker of a run needs, estimated from the resolved config and a layout (A30).

    layout = Layout.from_args(args)                    # tp, pp, dp, ZeRO stage of the config
    est = training_estimate(args, padded_vocab, layout, device="cpu")
    est.total, est.terms, est.summary()                # bytes; (name, bytes) pairs; one line

Everything is per worker (one rank) and in bytes; chosen/rejected pairs (dpo, rm) put twice
the micro-batch through the model; `summary()` prints GiB (2^30 bytes). With
pipeline stages the estimate is that of the stage that needs the most.

Training terms, with P the parameters on the rank (megatron/model/param_count.py, exact), d
the data-parallel degree and b the bytes of the run's dtype (fp32 4, bf16/fp16 2):
- weights            P * b; ZeRO 3 divides by d.
- gradients          P * b; ZeRO 2 and 3 divide by d.
- fp32 master copy   P * 8 (weights and their gradients in fp32, which DeepSpeed's bf16/fp16
                     optimizers and its ZeRO optimizer keep even for fp32 runs); none for plain
                     fp32 without ZeRO; ZeRO 1-3 divide by d.
- optimizer states   P * 4 * states (Adam: 2 moments, SGD with momentum: 1); ZeRO 1-3 divide by d.
- ZeRO gradient buckets  ZeRO 1 and 2 with contiguous_gradients (DeepSpeed's default): the
                     buffers of reduce_bucket_size elements (default 5e8) DeepSpeed allocates
                     in every step's backward to copy the gradients into, in the run's dtype
                     (fp32 where fp16 weights accumulate their gradients in fp32 under ZeRO
                     1): one, two with overlap_comm; under the pipeline engine two (its own
                     and the one of the reduction, overlap_comm being off there). On CPU
                     only the pages the gradients are written to become resident, so each
                     counts min(reduce_bucket_size, P) elements there. None with bf16 and
                     data_types.grad_accum_dtype fp32 under ZeRO 1 without optimizer offload
                     (DeepSpeed's bf16 optimizer).
- activations        per micro-batch and transformer layer, in elements of the run's dtype
                     (Korthikanti et al. 2022, "Reducing Activation Recomputation", generalised
                     to GQA, any MLP width and gated activations):
                       4sbh (two norm inputs, attention and MLP inputs; /tp with sequence
                       parallelism) + sb(2*heads*d + 2*kv_heads*d)/tp (q, k, v, attention
                       output; in fp32 where bf16/fp16 products run as fp32 on a CPU,
                       cpu_matmul_precision) + sb(up + ffn [+ ffn gated])/tp (MLP), plus one byte per
                       element of each dropout mask when dropout > 0. An MoE layer keeps,
                       for its k rows per token, the MLP's terms and the gathered input and
                       expert output (2h) over tp, plus the router's logits and probabilities
                       (2 * experts); the per-layer figure is the mean over dense and MoE
                       layers (and over Mamba layers, `mamba_layer_bytes`). Attention scores
                       [b, heads/tp, s, s] are stored only when the math kernel runs: on CPU,
                       torch SDPA uses its fused kernel unless attention_dropout > 0 and then
                       materialises fp32 scores (softmax output, dropout output: 8 bytes + a
                       1-byte mask per score); the blocked CPU kernel (bf16 or fp32 q, k,
                       v) keeps the causal blocks of its probabilities in their dtype (about
                       s(s + 64)/2 per head, `blocked_cpu_attention`); on CUDA the fused
                       kernels keep a [b, heads, s] fp32 log-sum-exp instead. With
                       checkpoint_activations a layer keeps only its input (sbh) and one layer
                       at a time is recomputed.
                       The first pipeline stage holds min(pp, gradient_accumulation_steps)
                       micro-batches in flight (1F1B), stage k min(pp - k, gas).
- backward working set  one layer's activations again: the gradients its backward allocates.
- reference model    DPO / KTO, on the last stage: the whole model's weights on the tensor rank
                     (its own experts under expert parallelism) in the dtype, and the fp32
                     logits of its forward pass.
- logits and loss    on the last stage: s*b*V/tp logits in the dtype, kept for the backward,
                     and their gradient in the dtype (2 * dtype bytes per logit; 4 more where
                     the LM head's products run in fp32 on a CPU); the blocked
                     cross entropy (megatron/mpu/cross_entropy.py) works in fp32 on one block
                     of BLOCK_ELEMENTS logits at a time (two fp32 copies of a block).
- framework          a stated constant per worker: FRAMEWORK_BYTES (torch, DeepSpeed and gloo
                     after import, measured as resident memory on CPU; CUDA context and NCCL
                     buffers on GPU, not measured here), plus DATA_WORKER_BYTES per data-loader
                     worker process on CPU.

Generation and eval (generate.py, eval.py) need the weights and, for generation with the cache,
the KV cache that check A29 computes (megatron/model/param_count.py kv_cache_elements) for
generation_batch_size sequences of max_position_embeddings positions, the most A29 lets a batch
reach; plus the logits of one batch and the framework constant.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.host import available_cpus
from megatron.model.config import GATED, attention_window
from megatron.model.cpu_attention_blocks import MAX_POSITIONS, kept_probabilities
from megatron.model.param_count import (expert_params_per_rank, kv_cache_elements,
                                        params_per_rank, stage_layers)
from megatron.mpu.blocks import BLOCK_ELEMENTS

GIB = 1024**3
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# resident memory of one worker before its model exists, by device kind (see the docstring)
FRAMEWORK_BYTES = {"cpu": GIB // 2, "cuda": GIB}
DATA_WORKER_BYTES = 128 * 1024**2  # each data-loader worker process (CPU memory)


@dataclass(frozen=True)
class Layout:
    """How the run is split: tensor-, pipeline-, data- and expert-parallel degrees, ZeRO
    stage."""

    tp: int = 1
    pp: int = 0  # pipe_parallel_size: 0 = no pipeline engine, 1 = one stage
    dp: int = 1
    zero_stage: int = 0
    ep: int = 1  # moe_expert_parallel_size

    @classmethod
    def from_args(cls, args) -> "Layout":
        return cls(tp=args.parallelism.model_parallel_size,
                   pp=args.parallelism.pipe_parallel_size,
                   dp=args.derived.data_parallel_size, zero_stage=args.deepspeed.zero_stage,
                   ep=args.parallelism.moe_expert_parallel_size)

    def describe(self) -> str:
        return (f"tp={self.tp} pp={self.pp} dp={self.dp}" + (f" ep={self.ep}" if self.ep > 1
                                                             else "") + f" ZeRO {self.zero_stage}")


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate of one worker: named terms in bytes, largest stage when pipelined."""

    terms: tuple[tuple[str, int], ...]
    params: int  # parameters held by the rank (before ZeRO 3 partitions them)
    layout: Layout
    stage: int = 0
    activation_note: str = ""

    @property
    def total(self) -> int:
        return sum(v for _, v in self.terms)

    def term(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def biggest(self) -> tuple[str, int]:
        return max(self.terms, key=lambda t: t[1])

    def summary(self) -> str:
        """'~X GiB per worker (weights a GiB, ...)', largest terms first."""
        parts = ", ".join(f"{name} {gib(v)}" for name, v in
                          sorted(self.terms, key=lambda t: -t[1]) if v)
        return f"~{gib(self.total)} per worker ({parts})"


    def table(self) -> list[str]:
        """One line per term and the total, aligned, in GiB."""
        width = max(len(name) for name, _ in self.terms)
        lines = [f"  {name:<{width}}  {v / GIB:>9.3f} GiB" for name, v in self.terms]
        return lines + [f"  {'total':<{width}}  {self.total / GIB:>9.3f} GiB"]


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB" if n < 10 * GIB else f"{n / GIB:.1f} GiB"


def training_estimate(args, padded_vocab: int, layout: Layout | None = None,
                      device: str = "cpu") -> MemoryEstimate:
    """Per-worker memory of train.py for `args` at `layout` (the config's own by default)."""
    from megatron.model.config import model_config_from_args

    layout = layout or Layout.from_args(args)
    config = model_config_from_args(args, padded_vocab)
    method = args.parallelism.pipe_partition_method
    per_stage = params_per_rank(config, layout.tp, layout.pp, method, layout.ep)
    stages = stage_layers(config, layout.pp, method, layout.tp, layout.ep)
    best = None
    for k, (params, layers) in enumerate(zip(per_stage, stages)):
        blocks = sum(1 for i in layers if 1 <= i <= config.num_layers)
        last = k == len(stages) - 1
        experts = expert_params_per_rank(config, layers, layout.tp, layout.ep)
        est = _stage_estimate(args, config, layout, device, params, blocks, k, last, experts)
        if best is None or est.total > best.total:
            best = est
    return best


def _stage_estimate(args, config, layout: Layout, device: str, params: int, blocks: int,
                    stage: int, last: bool, experts: int = 0) -> MemoryEstimate:
    """`experts`: how many of the rank's `params` are expert weights, which ZeRO partitions
    over the ranks holding the same experts (dp / ep) rather than over dp."""
    precision = args.derived.precision
    b = DTYPE_BYTES[precision]
    d, z = layout.dp, layout.zero_stage
    opt = args.optimizer.optimizer
    from megatron.training.optimizers import state_keys

    def held(per_param: int, from_stage: int) -> int:  # bytes on the rank, after ZeRO
        if z < from_stage:
            return params * per_param
        return ((params - experts) * per_param // d
                + experts * per_param // max(d // layout.ep, 1))

    states = len(state_keys(opt["type"], opt.get("params", {})))
    terms = [
        ("weights", held(b, 3)),
        ("gradients", held(b, 2)),
        ("fp32 master copy", 0 if (precision == "fp32" and z == 0) else held(8, 1)),
        ("optimizer states", held(4 * states, 1)),
        ("ZeRO gradient buckets", zero_bucket_bytes(args, layout, device, params)),
    ]
    act = Activations.from_args(args, config, layout.tp, device)
    in_flight = 1 if layout.pp <= 1 else min(layout.pp - stage, args.derived.gradient_accumulation_steps)
    terms += [("activations", in_flight * act.stored(blocks)),
              ("backward working set", act.layer if blocks else 0),
              ("logits and loss", act.logits if last else 0),
              ("reference model", reference_bytes(args, config, layout.tp, layout.ep) if last
               else 0),
              ("framework", framework_bytes(args, device))]
    return MemoryEstimate(tuple(terms), params, layout, stage, act.note)


def zero_bucket_bytes(args, layout: Layout, device: str, params: int) -> int:
    """DeepSpeed's contiguous gradient buckets under ZeRO 1 and 2 (module docstring); counted
    from DeepSpeed 0.19's stage_1_and_2.py and the buffers its steps allocate on a CPU."""
    from megatron.neox_arguments.sections.deepspeed import GRAD_ACCUM_DTYPES

    zero, z = args.deepspeed.zero_optimization, layout.zero_stage
    if z not in (1, 2) or not zero.get("contiguous_gradients", True):
        return 0
    precision = args.derived.precision
    accum = GRAD_ACCUM_DTYPES.get((args.deepspeed.data_types or {}).get("grad_accum_dtype"),
                                  precision)
    offload = (zero.get("offload_optimizer") or {}).get("device") == "cpu" \
        or zero.get("cpu_offload") is True
    if z == 1 and precision == "bf16" and accum == "fp32" and not offload:
        return 0  # DeepSpeed's bf16 optimizer, which has no such buckets
    count = 2 if layout.pp >= 1 or zero.get("overlap_comm", False) else 1
    elements = int(float(zero.get("reduce_bucket_size", 5e8)))
    if device != "cuda":
        elements = min(elements, params)
    accumulates_fp32 = z == 1 and accum == "fp32" and precision != "fp32"
    return count * elements * (4 if accumulates_fp32 else DTYPE_BYTES[precision])


def reference_bytes(args, config, tp: int, ep: int = 1) -> int:
    """DPO / KTO's frozen reference model on the last stage: the whole model's weights on a
    tensor-parallel rank (its own experts only, under expert parallelism), in the run's dtype,
    and the logits of its forward pass."""
    t = args.training
    from megatron.neox_arguments.validate_post_training import needs_reference

    if not needs_reference(t):
        return 0
    from megatron.model.param_count import params_per_rank

    b = DTYPE_BYTES[args.derived.precision]
    rows = rows_per_sample(args) * args.derived.train_micro_batch_size_per_gpu
    return (params_per_rank(config, tp, ep=ep)[0] * b
            + rows * config.seq_length * (config.padded_vocab_size // tp) * 4)


def rows_per_sample(args) -> int:
    """Sequences the model reads per sample: 2 for chosen/rejected pairs (dpo, rm), else 1."""
    return 2 if args.training.train_impl in ("dpo", "rm") else 1


def framework_bytes(args, device: str) -> int:
    """The stated per-worker constant (module docstring); loader workers as many as the loaders
    will start (num_workers, at most this machine's CPUs)."""
    if device == "cuda":
        return FRAMEWORK_BYTES["cuda"]
    return FRAMEWORK_BYTES["cpu"] + min(args.data.num_workers, available_cpus()) * DATA_WORKER_BYTES


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro-batch on one rank."""

    layer: int  # one transformer layer, everything its backward needs
    layer_input: int  # what a checkpointed layer keeps
    logits: int
    checkpointed: bool
    note: str

    def stored(self, blocks: int) -> int:
        """Kept between forward and backward by `blocks` layers of one micro-batch."""
        if not blocks:
            return 0
        if self.checkpointed:  # inputs of every layer, plus the one being recomputed
            return blocks * self.layer_input + self.layer
        return blocks * self.layer

    @classmethod
    def from_args(cls, args, config, tp: int, device: str) -> "Activations":
        s = config.seq_length
        mb = args.derived.train_micro_batch_size_per_gpu * rows_per_sample(args)
        e = DTYPE_BYTES[args.derived.precision]
        sp = args.parallelism.sequence_parallel and tp > 1
        layer, note = layer_activation_bytes(config, mb, s, tp, sp, e, device)
        per_rank = mb * s * (config.padded_vocab_size // tp)
        logits = per_rank * 2 * e + 2 * 4 * min(per_rank, BLOCK_ELEMENTS)
        if cpu_fp32_products(config, e, device):  # the LM head's backward: fp32 logit grads
            logits += per_rank * 4
        if getattr(config, "value_head", False):
            logits = mb * s * 12  # one fp32 value per position, its gradient and the loss's
        return cls(layer=layer, layer_input=mb * s * config.hidden_size * e // (tp if sp else 1),
                   logits=logits, checkpointed=args.parallelism.checkpoint_activations, note=note)


def cpu_fp32_products(config, e: int, device: str) -> bool:
    """Whether a run in `e`-byte elements multiplies them as fp32 on this CPU
    (cpu_matmul_precision, megatron/mpu/products.py)."""
    return device == "cpu" and e < 4 and config.fp32_products


def blocked_cpu_attention(config, s: int, e: int, device: str) -> bool:
    """Whether plain causal attention runs through the blocked CPU kernel, which keeps its
    probabilities (megatron/model/cpu_attention.py `supports`): on a CPU (bf16 or fp32 q, k
    and v), no attention dropout, up to MAX_POSITIONS positions, no ALiBi bias or sliding
    window. Runs whose documents mask each other (reset_attention_mask) pass a mask and take
    SDPA instead; the estimate counts the probabilities for them too."""
    return (device == "cpu" and config.attention_dropout == 0 and s <= MAX_POSITIONS
            and config.pos_emb != "alibi"
            and not any(attention_window(config.attention_type(i), config.sliding_window_width)
                        for i in range(config.num_layers)))


def layer_activation_bytes(config, mb: int, s: int, tp: int, sp: bool, e: int,
                           device: str) -> tuple[int, str]:
    """(bytes one transformer layer keeps for backward for one micro-batch, which attention
    memory was assumed); the formula is in the module docstring."""
    h, d, f = config.hidden_size, config.head_dim, config.intermediate_size
    heads, kv = config.num_attention_heads, config.num_kv_heads
    sb = s * mb
    shared = 4 * sb * h * e + (2 * sb * h if config.hidden_dropout > 0 else 0)
    attn_e = 4 if cpu_fp32_products(config, e, device) else e  # fp32 q, k, v and output
    attn = sb * (2 * heads * d + 2 * kv * d) * attn_e // tp
    gated = config.activation in GATED
    per_row = (2 * f if gated else f) + f + (f if gated else 0)
    mlp = sb * per_row * e // tp
    moe_layers = sum(config.is_moe_layer(i) for i in range(config.num_layers))
    if moe_layers:  # averaged over the layers: an MoE layer's MLP part instead of the MLP's
        k, experts = config.moe_top_k, config.moe_num_experts
        moe = sb * (k * (per_row + 2 * h) // tp + 2 * experts) * e
        mlp = (mlp * (config.num_layers - moe_layers) + moe * moe_layers) // config.num_layers
    if device == "cpu" and config.attention_dropout > 0:
        scores = mb * (heads // tp) * s * s * 9
        note = "math attention (CPU with attention_dropout > 0): fp32 scores stored"
    elif blocked_cpu_attention(config, s, e, device):
        scores = mb * (heads // tp) * kept_probabilities(s) * attn_e
        note = (f"blocked CPU attention (up to {MAX_POSITIONS} positions): its causal "
                "blocks of probabilities stored")
    else:
        scores = mb * (heads // tp) * s * 4
        note = "fused attention (torch SDPA flash/efficient kernel): no [s, s] scores stored"
    layer = (shared // (tp if sp else 1)) + attn + mlp + scores
    mamba_layers = sum(config.is_mamba_layer(i) for i in range(config.num_layers))
    if mamba_layers:  # averaged over the layers, as MoE layers are
        bytes_, scan_note = mamba_layer_bytes(config, sb, tp, e, device)
        layer = (layer * (config.num_layers - mamba_layers)
                 + bytes_ * mamba_layers) // config.num_layers
        note += f"; Mamba layers: {scan_note}"
    return layer, note


def mamba_layer_bytes(config, sb: int, tp: int, e: int, device: str) -> tuple[int, str]:
    """(what a Mamba layer keeps for backward over sb tokens, which scan that assumes).

    In the run's dtype: its input, the projections' outputs (x and z halves and their
    contiguous copies, the convolution's output, the step-size projection), dt/B/C; the inputs
    of in_proj, x_proj and out_proj in the dtype their products run in (fp32 for bf16 on a CPU,
    cpu_matmul_precision); in fp32, where the scan works: the step sizes before and after
    softplus, delta * x, the scan output, the skip and the gate and their products (12 [tokens,
    channels] tensors);
    then by scan (megatron/model/selective_scan.py): the reference step loop keeps the decays and
    inputs of every step [tokens, channels, 16] in fp32; the chunked scan one state per 64-step
    chunk; mamba_ssm's kernel recomputes its states. Fitted to the peak memory of real steps
    (tests/training/test_memory_estimate.py)."""
    from megatron.model.config import STATE_SIZE, dt_rank
    from megatron.model.mamba_paths import paths

    h, c, n = config.hidden_size, config.mamba_inner_size // tp, STATE_SIZE
    pe = 4 if cpu_fp32_products(config, e, device) else e  # in_proj/x_proj/out_proj inputs
    kept = (sb * (h + 6 * c + dt_rank(h) + 2 * n) * e + sb * (h + 2 * c) * pe
            + sb * c * 4 * 12)
    scan, _ = paths(config, "cuda" if device == "cuda" else "cpu")
    if scan == "reference scan":
        return kept + 2 * sb * c * n * 4, "the reference scan's fp32 decays and inputs stored"
    if scan == "chunked torch scan":
        return kept + sb * c * n * 4 // 64, "the chunked scan keeps one state per 64 steps"
    return kept, "mamba_ssm's kernel recomputes its states"


def inference_estimate(args, padded_vocab: int, tp: int, device: str, dtype_bytes: int,
                       script: str = "generate.py") -> MemoryEstimate:
    """Per-worker memory of generate.py / eval.py: the weights, the checkpoint being read (its
    full, unsharded weights, read on every rank before this rank keeps its shard), for
    generate.py without `recompute` the KV cache of A29, and one batch's logits."""
    from megatron.model.config import model_config_from_args

    config = model_config_from_args(args, padded_vocab)
    params = params_per_rank(config, tp)[0]
    generating = script == "generate.py"
    batch = args.text_generation.generation_batch_size if generating else args.eval.eval_batch_size
    positions = config.max_position_embeddings if generating else config.seq_length
    kv = 0
    if generating and not args.text_generation.recompute:
        kv = kv_cache_elements(config.num_layers, batch, positions, config.num_kv_heads // tp,
                               config.head_dim) * dtype_bytes
    terms = (("weights", params * dtype_bytes),
             ("checkpoint being read", params_per_rank(config)[0] * dtype_bytes),
             ("KV cache", kv),
             ("logits", batch * positions * (padded_vocab // tp) * (dtype_bytes + 4)),
             ("framework", framework_bytes(args, device)))
    return MemoryEstimate(terms, params, Layout(tp=tp), 0, "")
