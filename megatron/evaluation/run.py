"""eval.py's work: score a checkpoint on lm-eval tasks and write the results.

Every rank runs `run_evaluation(args)`; global rank 0 writes `{eval_results_prefix}_eval_results_
<YYYY-MM-DD-HH-MM-SS>.json` (`eval_results_<date>.json` without a prefix; the prefix may hold
directories): lm-eval's result dict ("results", "versions", "n-shot", "configs", "config", ...)
plus "checkpoint" (directory, iteration, model_parallel_size, replicas). The metrics also go to
the run's trackers (metrics.jsonl in log_dir, TensorBoard, wandb, Comet) as
`eval/<task>/<metric>` at the checkpoint's iteration, and lm-eval's table is printed. With
eval_cache_dir the scores of finished requests are kept for a run of the same command
(cache.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from megatron.evaluation.hub import fetch_failure
from megatron.monitoring.logger import get_logger, print_rank_0
from megatron.text_generation.runtime import inference_runtime

log = get_logger(__name__)


def results_path(prefix: str, output_dir: str, when: float | None = None) -> Path:
    """Where the results JSON goes: `{prefix}_eval_results_<date>.json` for an
    `eval_results_prefix`, else `<output_dir>/eval/eval_results_<date>.json`."""
    stamp = time.strftime("%m-%d-%Y-%H-%M-%S", time.localtime(when))  # GPT-NeoX's format
    name = f"eval_results_{stamp}.json"
    return Path(f"{prefix}_{name}") if prefix else Path(output_dir) / "eval" / name


def flat_metrics(results: dict) -> dict[str, float]:
    """{'eval/<task>/<metric>[/<filter>]': value} for every numeric metric lm-eval reported."""
    out = {}
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, _, filt = key.partition(",")
            name = metric if filt in ("", "none") else f"{metric}/{filt}"
            out[f"eval/{task}/{name}"] = float(value)
    return out


def run_evaluation(args) -> dict | None:
    """Run eval_tasks on the checkpoint in `load`; returns lm-eval's results (None off rank 0)."""
    ev = args.eval
    from megatron.evaluation.task_data import check_offline_data
    from megatron.evaluation.tasks import (check_eval_settings, resolve_task_entries,
                                           task_manager_for)

    check_eval_settings(ev)
    from megatron.evaluation.adapter import NeoXLM  # A28: checks the lm-eval version

    names, include = resolve_task_entries(ev.eval_tasks, ev.eval_include_path)
    manager = task_manager_for(names, include)  # unknown tasks fail before the weights load
    check_offline_data(ev, os.environ, probe=False)  # so do datasets missing offline
    with inference_runtime(args) as rt:
        rt.load_model()
        cache = score_cache(args, rt) if ev.eval_cache_dir else None
        lm = NeoXLM(rt.model, rt.tokenizer, rt.replicas, ev.eval_batch_size,
                    seed=args.training.seed, cache=cache)
        try:
            results = evaluate_tasks(lm, names, manager, ev, args.training.seed)
        finally:
            if cache is not None:
                cache.close()
        if not rt.replicas.writer or results is None:
            return None
        results["checkpoint"] = {"directory": rt.checkpoint_step, "iteration": rt.iteration,
                                 "model_parallel_size": rt.tensor_parallel.size,
                                 "replicas": rt.replicas.count}
        _report(args, results, rt.iteration)
        return results


def score_cache(args, rt):
    """The ScoreCache of this checkpoint and scoring setup in eval_cache_dir: the checkpoint
    (its manifest's digest, or its files' sizes and times where it has no manifest), the
    resolved model config (positions, products, ...), the tokenizer files, the dtype and device,
    the tensor-parallel size, the replicas and the batch size."""
    import dataclasses
    import hashlib

    from megatron.checkpointing.layout import manifest_digest
    from megatron.evaluation.cache import ScoreCache
    from megatron.text_generation.runtime import inference_dtype

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    step = Path(rt.checkpoint_step).absolute()
    files = manifest_digest(step) or digest(json.dumps(sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in step.iterdir() if p.is_file()
    )).encode())
    tok = args.tokenizer
    tokenizer = [tok.tokenizer_type] + [digest(Path(f).read_bytes()) if Path(f).is_file() else f
                                        for f in (tok.vocab_file, tok.merge_file) if f]
    dtype = inference_dtype(args.derived.precision, rt.device)
    setup = {"checkpoint": str(step), "iteration": rt.iteration, "files": files,
             "model": digest(json.dumps(dataclasses.asdict(rt.model.config), sort_keys=True,
                                        default=str).encode()),
             "tokenizer": digest(json.dumps(tokenizer).encode()),
             "dtype": str(dtype).replace("torch.", ""), "device": rt.device.type,
             "model_parallel_size": rt.tensor_parallel.size, "replicas": rt.replicas.count,
             "batch_size": args.eval.eval_batch_size}
    return ScoreCache.open(args.eval.eval_cache_dir, setup, rt.replicas)


def evaluate_tasks(lm, names, manager, ev, seed: int) -> dict | None:
    """lm-eval's simple_evaluate of `names` with the config's few-shot, limit and seeds."""
    from jinja2.exceptions import UndefinedError
    from lm_eval.evaluator import simple_evaluate

    try:
        return simple_evaluate(
            model=lm, tasks=names, num_fewshot=ev.eval_num_fewshot, limit=ev.eval_limit,
            bootstrap_iters=ev.eval_bootstrap_iters, task_manager=manager, log_samples=False,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed)
    except ConnectionError as err:  # a registry task's dataset could not be downloaded
        raise RuntimeError(fetch_failure(err, os.environ)) from None
    except UndefinedError as err:  # a template names a field the documents do not have
        raise ValueError(f"a task's template could not be filled from its documents ({err}); "
                         f"check doc_to_text, doc_to_target and doc_to_choice of the tasks "
                         f"{', '.join(names)} against the fields of their data") from None


def _report(args, results: dict, iteration: int | None) -> None:
    from lm_eval.utils import make_table

    from megatron.monitoring.trackers import MetricsTracker

    path = results_path(args.eval.eval_results_prefix, args.derived.output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    print_rank_0(make_table(results))
    print_rank_0(f"wrote eval results to {path}")
    tracker = MetricsTracker.from_args(args, enabled=True)
    try:
        tracker.log(flat_metrics(results), step=iteration or 0)
    finally:
        tracker.close()
