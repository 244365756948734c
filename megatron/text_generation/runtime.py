"""Process layout for generation and eval: tensor-parallel groups, model replicas, the model.

    with inference_runtime(args) as rt:       # every rank; joins the process group
        rt.tokenizer ...                        # validate inputs before the weights load
        rt.load_model()                         # rt.model: an InferenceModel
        mine = rt.replicas.split(len(items))    # this replica's share of the work
        every = rt.replicas.gather(results, len(items))

Generation and eval run the non-pipelined model. The run's model_parallel_size is honoured (the
ranks of a tensor-parallel group cooperate on every forward); pipeline stages are folded into
replicas: world / tp replicas, each holding every layer, split the prompts or requests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

import torch

from megatron.monitoring.logger import get_logger
from megatron.text_generation.inference_model import DTYPES, InferenceModel

log = get_logger(__name__)


@dataclass(frozen=True)
class Replicas:
    """This rank's replica among `count` replicas; `writer` is the rank that writes outputs."""

    index: int = 0
    count: int = 1
    writer: bool = True
    topology: object | None = None  # a Topology when distributed

    def split(self, n: int) -> list[int]:
        """Indices (of n items) this replica handles: every count-th, from its own index."""
        return list(range(self.index, n, self.count))

    def gather(self, local: list, n: int) -> list:
        """All n results in item order on every rank, from each replica's `split` share."""
        if self.count == 1:
            return list(local)
        import torch.distributed as dist

        pieces: list = [None] * dist.get_world_size()
        dist.all_gather_object(pieces, list(local))
        out: list = [None] * n
        for rank, piece in enumerate(pieces):
            c = self.topology.coords(rank)
            if c.model != 0:  # tensor-parallel peers hold the same results
                continue
            for i, value in zip(range(c.data, n, self.count), piece):
                out[i] = value
        return out


def inference_device() -> torch.device:
    """This worker's GPU (LOCAL_RANK) when CUDA is present, else the CPU (A6)."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def inference_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The weights' dtype for the run's precision; fp16 on a CPU runs in fp32 (warned)."""
    if precision == "fp16" and device.type == "cpu":
        log.warning("precision fp16 is not supported on CPU; generating in fp32 instead")
        return torch.float32
    return DTYPES[precision]


@dataclass
class InferenceRuntime:
    """What a generation/eval worker holds: config, tokenizer, replicas and (once loaded) model."""

    args: object
    tokenizer: object
    replicas: Replicas
    tensor_parallel: object
    device: torch.device
    model: InferenceModel | None = None
    checkpoint_step: str = ""
    iteration: int | None = None

    def load_model(self) -> InferenceModel:
        """Read the checkpoint named by `load`/`iteration`, reshard it for this run's tp."""
        self.model, self.checkpoint_step, self.iteration = load_inference_model(
            self.args, self.tokenizer, self.tensor_parallel, self.device)
        return self.model


def load_inference_model(args, tokenizer, tp, device: torch.device
                         ) -> tuple[InferenceModel, str, int | None]:
    """(model, checkpoint directory, iteration) for `args` on this rank's tensor-parallel view."""
    from megatron.model.config import model_config_from_args
    from megatron.mpu.products import describe as describe_products
    from megatron.mpu.products import resolve as resolve_products
    from megatron.neox_arguments.derived import round_up
    from megatron.checkpointing.model_shape import check_architecture
    from megatron.checkpointing.reader import read_checkpoint, resize_vocab

    ck = read_checkpoint(args.checkpoint.load, args.checkpoint.iteration, run_args=args)
    trained = ck.trained_vocab
    limit = max(tokenizer.vocab_size, tokenizer.max_token_id + 1)
    if limit > trained:
        raise ValueError(f"the tokenizer has {limit} ids but the checkpoint {ck.step_dir} embeds "
                         f"only {trained}: this is not the tokenizer the model was trained with "
                         "(check tokenizer_type / vocab_file)")
    ck.language_model("generation and evaluation")
    saved_config = ck.saved_model_config(args, trained)
    vocab = round_up(trained, tp.size)
    config = dataclasses.replace(model_config_from_args(args, vocab), padded_vocab_size=vocab)
    check_architecture(config, saved_config, ck.step_dir)
    dtype = inference_dtype(args.derived.precision, device)
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    products, why = resolve_products(config.cpu_matmul_precision, precision, device.type)
    if why:
        log.info("%s", describe_products(products, why))
    config = dataclasses.replace(config, cpu_matmul_precision=products)
    weights = resize_vocab(ck.canonical, config.num_layers, vocab)
    model = InferenceModel.from_canonical(config, weights, tp, device, dtype, token_limit=limit,
                                          trained_vocab=trained)
    log.info("loaded %s (written with model_parallel_size %d) for model_parallel_size %d, %s "
             "on %s", ck.step_dir, ck.tensor_parallel, tp.size, str(dtype).replace("torch.", ""),
             device)
    return model, str(ck.step_dir), ck.iteration


@contextlib.contextmanager
def inference_runtime(args):
    """Join the process group, build tensor-parallel groups and replicas; leave on exit."""
    import torch.distributed as dist

    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.initialize import collective_timeout, destroy_distributed, init_distributed
    from megatron.mpu.topology import Topology
    from megatron.tokenizer import build_tokenizer

    init_distributed(args.parallelism.distributed_backend,
                     args.launcher.distributed_timeout_minutes, args.launcher)
    try:
        world, tp = dist.get_world_size(), args.parallelism.model_parallel_size
        if args.parallelism.pipe_parallel_size > 1:
            log.info("pipe_parallel_size %d is folded into replicas for inference: every "
                     "tensor-parallel group holds all layers", args.parallelism.pipe_parallel_size)
        if args.parallelism.moe_expert_parallel_size > 1:
            log.info("moe_expert_parallel_size %d is folded into replicas for inference: every "
                     "tensor-parallel rank holds its experts whole",
                     args.parallelism.moe_expert_parallel_size)
        topology = Topology.from_world(world, tp, 1)
        groups = ProcessGroups.build(
            topology, collective_timeout(args.launcher.distributed_timeout_minutes))
        rank = dist.get_rank()
        replicas = Replicas(topology.coords(rank).data, topology.dp, rank == 0, topology)
        log.info("inference on %d rank(s): model_parallel_size %d, %d replica(s)", world, tp,
                 topology.dp)
        torch.manual_seed(args.training.seed)
        tok = args.tokenizer
        tokenizer = build_tokenizer(tok.tokenizer_type, tok.vocab_file, tok.merge_file)
        tp_view = groups.tensor_parallel(args.training.seed,
                                         fp32_reduce=args.deepspeed.fp32_allreduce)
        yield InferenceRuntime(args, tokenizer, replicas, tp_view, inference_device())
    finally:
        destroy_distributed()
