"""lm-eval tasks during training, as GPT-NeoX runs them: with `eval_tasks` set, train.py scores
the model on those tasks at every evaluation (each `eval_interval`, and at the end of training)
and logs the metrics like the rest (`eval/<task>/<metric>` in metrics.jsonl and every tracker,
one console line).

The training model's weights are copied, as this rank holds them (its tensor-parallel shard),
into an inference GPTModel; the data-parallel ranks are the replicas that split the requests
(as eval.py's replicas do). Neither the training RNG streams nor the data position are touched:
the harness reseeds Python's, NumPy's and torch's generators, so their states are restored
after it. Pipeline-parallel runs (stages hold different layers) and ZeRO stage 3 (weights
partitioned over ranks) are refused at start-up, naming the keys.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def refusal(args) -> str | None:
    """Why this training config cannot run eval_tasks during training, or None."""
    if not args.eval.eval_tasks:
        return None
    if args.parallelism.pipe_parallel_size > 1:
        return (f"eval_tasks during training needs every layer on each rank, but "
                f"pipe_parallel_size is {args.parallelism.pipe_parallel_size}: run the tasks "
                "on a checkpoint with `python deepy.py eval.py ...` instead, or remove eval_tasks "
                "from the training config")
    if args.deepspeed.zero_stage == 3:
        return ("eval_tasks during training reads each rank's weights, which ZeRO stage 3 "
                "partitions: run the tasks on a checkpoint with `python deepy.py eval.py ...`, "
                "or remove eval_tasks from the training config")
    return None


class TaskEvaluator:
    """Runs the configured lm-eval tasks on the training engine's current weights."""

    def __init__(self, args, engine, model_config, tokenizer):
        from megatron.evaluation.adapter import NeoXLM  # noqa: F401 (A28: lm-eval version)
        from megatron.evaluation.task_data import check_offline_data
        from megatron.evaluation.tasks import resolve_task_entries, task_manager_for

        self.args, self.engine = args, engine
        self.model_config, self.tokenizer = model_config, tokenizer
        self.names, include = resolve_task_entries(args.eval.eval_tasks,
                                                   args.eval.eval_include_path)
        self.manager = task_manager_for(self.names, include)  # unknown tasks fail now
        check_offline_data(args.eval, os.environ, probe=False)  # datasets missing offline too

    def inference_model(self):
        """An inference copy of this rank's training weights (built without drawing from the
        RNG streams, which the caller saves and restores around it)."""
        from megatron.model.gpt import GPTModel
        from megatron.model.partition import canonical_param_name
        from megatron.text_generation.inference_model import InferenceModel

        module = self.engine.engine.module
        state = {f"layers.{canonical_param_name(name)}": tensor.detach()
                 for name, tensor in module.state_dict().items()}
        model = GPTModel(self.model_config, self.engine.tp)
        model.load_state_dict(state, strict=True)
        param = next(module.parameters())
        model.to(device=param.device, dtype=param.dtype)
        tok = self.tokenizer
        limit = max(tok.vocab_size, tok.max_token_id + 1)
        return InferenceModel(model, self.engine.tp, self.model_config.padded_vocab_size, limit)

    def run(self) -> dict[str, float]:
        """{'eval/<task>/<metric>': value}, the same on every rank. Collective."""
        from megatron.evaluation.adapter import NeoXLM
        from megatron.evaluation.run import evaluate_tasks, flat_metrics
        from megatron.text_generation.runtime import Replicas

        topology = self.engine.topology
        rank = torch.distributed.get_rank()
        c = topology.coords(rank)
        replicas = Replicas(c.data, topology.dp, rank == 0, topology)
        ev, seed = self.args.eval, self.args.training.seed
        states = (random.getstate(), np.random.get_state())
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        try:
            with torch.random.fork_rng(devices=devices):
                lm = NeoXLM(self.inference_model(), self.tokenizer, replicas,
                            ev.eval_batch_size, seed=seed)
                results = evaluate_tasks(lm, self.names, self.manager, ev, seed)
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
        return flat_metrics(results or {})


def console_line(iteration: int, metrics: dict[str, float]) -> str:
    """' lm-eval at iteration N | tiny_mc acc 0.5000 | tiny_mc acc_norm 0.2500'."""
    parts = [f"{name[len('eval/'):].replace('/', ' ', 1)} {value:.4f}"
             for name, value in sorted(metrics.items()) if "_stderr" not in name]
    return f" lm-eval at iteration {iteration} | " + " | ".join(parts)
