"""`pretrain`: a whole training run on one worker, from the resolved config to the last save."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from megatron.checkpointing import load_checkpoint, save_checkpoint, should_save
from megatron.checkpointing.fine_tune import (FINE_TUNED_FROM, fine_tune_record,
                                              resume_fine_tune, resumed_from_save)
from megatron.checkpointing.layout import iteration_of, read_latest
from megatron.checkpointing.locate import newest_good_iteration
from megatron.checkpointing.model_shape import vocab_for_run
from megatron.data.fingerprints import (changed_data_error, check_datasets_unchanged,
                                        check_file_sizes, compare_fingerprints,
                                        dataset_fingerprints)
from megatron.model.compile import graphs_compiled
from megatron.model.config import model_config_from_args
from megatron.monitoring.logger import get_logger, print_rank_0
from megatron.monitoring.profiler import StepProfiler
from megatron.monitoring.trackers import MetricsTracker
from megatron.mpu.groups import ProcessGroups
from megatron.mpu.initialize import collective_timeout, destroy_distributed, init_distributed
from megatron.mpu.topology import Topology
from megatron.neox_arguments import padded_vocab_size
from megatron.tokenizer import build_tokenizer
from megatron.data.options import sample_counts
from megatron.training.data import build_datasets, micro_batch_iterator
from megatron.training.engine import build_engine
from megatron.training.flops import flops_per_token
from megatron.training.objectives import batch_options
from megatron.training.reference import SOURCE_KEY as REFERENCE_KEY
from megatron.training.reference import build_reference, reference_source
from megatron.training.step import run_step
from megatron.training.train_log import TrainLog, console_metrics, interval_means
from megatron.safety import watchdog
from megatron.safety.guard import StepGuard, TrainingStopped, weights_finite
from megatron.safety.lock import run_lock
from megatron.safety.signals import Preempted, StopSignals
from megatron.training.finished import ended_at, nothing_to_train
from megatron.training.run_summary import RunSummary

log = get_logger(__name__)


@dataclass
class RunState:
    """Where the run is: what a checkpoint records so that a resume continues exactly."""

    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    interval_losses: list = field(default_factory=list)
    interval_metrics: list = field(default_factory=list)  # the objective's, one dict per step
    interval_applied: list = field(default_factory=list)  # per step: the optimizer applied it
    data_fingerprints: dict = field(default_factory=dict)
    last_loss: float | None = None  # of the last step, recorded in the manifest
    reference: dict | None = None  # where DPO/KTO's reference model is read from
    fine_tuned_from: dict | None = None  # the checkpoint a fine-tune started from

    def clear_interval(self) -> None:
        """Start a new log interval."""
        for steps in (self.interval_losses, self.interval_metrics, self.interval_applied):
            steps.clear()

    def client_state(self) -> dict:
        state = {"consumed_train_samples": self.consumed_train_samples,
                 "consumed_valid_samples": self.consumed_valid_samples,
                 "data_fingerprints": self.data_fingerprints, "last_loss": self.last_loss}
        if self.reference is not None:
            state[REFERENCE_KEY] = self.reference
        if self.fine_tuned_from is not None:
            state[FINE_TUNED_FROM] = self.fine_tuned_from
        return state


def set_seeds(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pretrain(args) -> RunState:
    """Train `args` to train_iters on this worker; returns the final state. Collective: every rank."""
    init_distributed(args.parallelism.distributed_backend,
                     args.launcher.distributed_timeout_minutes, args.launcher)
    _host_memory()
    try:
        with run_lock(args.checkpoint.save), \
                watchdog.running(args, dist.get_rank(), dist.get_world_size()):  # A33, A4
            args = _agreed_fine_tune_resume(args)
            return _pretrain(args.with_world_size(dist.get_world_size()))
    finally:
        destroy_distributed()


def _agreed_fine_tune_resume(args):
    """resume_fine_tune as rank 0 decides it (the files it reads may differ between machines),
    applied on every rank. Collective."""
    resume = _agreed(lambda: resume_fine_tune(args, announce=True) is not args)
    return resumed_from_save(args) if resume else args


def _host_memory() -> None:
    """On the CPU accelerator, keep freed host memory for the next step (host_memory.py)."""
    from deepspeed.accelerator import get_accelerator

    from megatron.training.host_memory import keep_freed_memory

    if get_accelerator().device_name() == "cpu":
        line = keep_freed_memory()
        if line and dist.get_rank() == 0:
            log.debug("%s", line)  # a detail of the CPU runtime: log_level debug shows it


def setup_engine(args):
    """(engine, topology, tokenizer, model config) of this worker, seeded. Collective."""
    set_seeds(args.training.seed)
    topology = Topology.from_world(dist.get_world_size(), args.parallelism.model_parallel_size,
                                   args.parallelism.pipe_parallel_size,
                                   args.parallelism.moe_expert_parallel_size)
    tokenizer = build_tokenizer(args.tokenizer.tokenizer_type, args.tokenizer.vocab_file,
                                args.tokenizer.merge_file)
    vocab = _model_vocab(args, tokenizer)
    model_config = model_config_from_args(args, vocab)
    timeout = collective_timeout(args.launcher.distributed_timeout_minutes)
    engine = build_engine(args, model_config, ProcessGroups.build(topology, timeout))
    return engine, topology, tokenizer, engine.model_config


def _model_vocab(args, tokenizer) -> int:
    """GPT-NeoX's padded vocabulary for a new run; a loaded checkpoint's own padded size
    otherwise (the one rank 0 reads, on every rank), so that it resumes at any tensor-parallel
    degree that divides it."""
    tp = args.parallelism.model_parallel_size
    default = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by, tp)
    vocab = _agreed(lambda: vocab_for_run(args.checkpoint.load, args.checkpoint.iteration,
                                          default, tp, tokenizer.vocab_size))
    if vocab != default:
        print_rank_0(f"padded vocabulary: {vocab} rows, as in the checkpoint to load "
                     f"(a new run at model_parallel_size {tp} would pad to {default})")
    return vocab


def _pretrain(args) -> RunState:
    rank = dist.get_rank()
    engine, topology, tokenizer, model_config = setup_engine(args)
    state = RunState()
    with watchdog.phase("checkpoint load"):
        resumed = load_checkpoint(engine, args.checkpoint)
    state.iteration = int(resumed.get("iteration", 0))
    train, valid = implied_position(args, state.iteration)
    state.consumed_train_samples = int(resumed.get("consumed_train_samples", train))
    state.consumed_valid_samples = int(resumed.get("consumed_valid_samples", valid))
    state.fine_tuned_from = fine_tune_record(resumed, bool(args.checkpoint.finetune))
    check_ranks_agree(state)
    if resumed and state.iteration >= args.training.train_iters:
        if _agreed(lambda: ended_at(args.logging.log_dir, state.iteration)):
            print_rank_0(nothing_to_train(args, state.iteration))
            return state
        print_rank_0(f"the checkpoint in {args.checkpoint.load} is at iteration "
                     f"{state.iteration}, train_iters {args.training.train_iters}, but its run's "
                     "last evaluations and summary were not written: doing them now, without "
                     "training or saving")

    counts = sample_counts(args, state.iteration, state.consumed_valid_samples)
    train_ds, valid_ds, test_ds = build_datasets(args, counts, tokenizer.vocab_size,
                                                 tokenizer.pad)
    datasets = [d for d in (train_ds, valid_ds) if d is not None]
    state.data_fingerprints = dataset_fingerprints(*datasets, mode=args.data.data_fingerprint)
    check_same_data(args, resumed, state.data_fingerprints)
    coords = topology.coords(rank)
    reference = None
    if engine.objective.needs_reference:
        state.reference = reference_source(args, resumed)
        reference = build_reference(args, engine, model_config, state.reference)
    batches = dict(options=batch_options(args, tokenizer.eod), objective=engine.objective,
                   reference=reference)
    train_iter = micro_batch_iterator(train_ds, state.consumed_train_samples, args, coords.data,
                                      topology.dp, **batches)
    valid_iter = micro_batch_iterator(valid_ds, state.consumed_valid_samples, args, coords.data,
                                      topology.dp, **batches)
    def test_iter():  # built at the end: its loader workers start only then
        return micro_batch_iterator(test_ds, 0, args, coords.data, topology.dp, **batches)
    tracker = MetricsTracker.from_args(args, enabled=rank == 0, start_iteration=state.iteration)
    print_rank_0(f"training {model_config.num_layers} layers x {model_config.hidden_size} hidden, "
                 f"{sum(p.numel() for p in engine.engine.module.parameters()):,} parameters on this "
                 f"rank, {topology.describe()}, from iteration "
                 f"{state.iteration} to {args.training.train_iters}")
    train_log = TrainLog(args, engine, tracker,
                         flops_per_token(model_config, args.model.seq_length), state.iteration,
                         model_config)
    profiler = StepProfiler.from_args(args, engine, state.iteration)
    tasks = None
    if args.eval.eval_tasks:
        from megatron.evaluation.during_training import TaskEvaluator

        tasks = TaskEvaluator(args, engine, model_config, tokenizer)
    try:
        _train(args, engine, state, (train_iter, valid_iter, test_iter), train_log, datasets,
               profiler, tasks)
    except Exception:  # a failed read, here or in a loader worker (one killed by SIGBUS too):
        check_file_sizes(*datasets)  # A16: name the token file that shrank, if one did
        raise
    finally:
        profiler.close()
        tracker.close()
    return state


def _agreed(decide):
    """`decide()` as rank 0 answers it (what it reads may exist on its machine only), on every
    rank; a ValueError it raises is raised on every rank. Collective."""
    answer = None
    if dist.get_rank() == 0:
        try:
            answer = (decide(), None)
        except ValueError as err:
            answer = (None, str(err))
    box = [answer]
    dist.broadcast_object_list(box, src=0)
    value, problem = box[0]
    if problem:
        raise ValueError(problem)
    return value


def implied_position(args, iteration: int) -> tuple[int, int]:
    """(train, validation) samples consumed after `iteration` steps when a checkpoint records
    none (one written by GPT-NeoX), as GPT-NeoX places its loaders on resuming: in batches of
    micro-batch x data-parallel samples, the train loader starts at iteration x gradient
    accumulation (one global batch per iteration), the validation loader at
    (iteration x accumulation // eval_interval) x eval_iters. That is eval_iters global batches
    per completed eval_interval when iteration is a multiple of eval_interval (or accumulation
    is 1); otherwise GPT-NeoX's rule counts part of an evaluation not yet run, and so does this
    (docs/gpt-neox.md)."""
    d, t = args.derived, args.training
    batch = d.train_micro_batch_size_per_gpu * d.data_parallel_size
    micro_steps = iteration * d.gradient_accumulation_steps
    evals = micro_steps // t.eval_interval * t.eval_iters if t.eval_interval else 0
    return micro_steps * batch, evals * batch


def check_same_data(args, resumed: dict, fingerprints: dict) -> None:
    """A17: a resumed run reads the token files the checkpoint was trained on."""
    saved = resumed.get("data_fingerprints")
    if not saved:
        return
    differences = compare_fingerprints(saved, fingerprints)
    if not differences:
        return
    text = "; ".join(differences)
    if args.checkpoint.allow_data_change:
        log.warning("resuming on different data (allow_data_change is on): %s", text)
        return
    raise changed_data_error(args.checkpoint.load, differences)


def check_ranks_agree(state: RunState) -> None:
    """A18: every rank resumes at the same iteration and data position, or none does."""
    values = torch.tensor([state.iteration, state.consumed_train_samples,
                           state.consumed_valid_samples], dtype=torch.float64)
    low, high = values.clone(), values.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise RuntimeError(
            f"ranks disagree on where to resume (iteration, consumed train samples, consumed valid "
            f"samples): rank {dist.get_rank()} has {values.long().tolist()}, the range over ranks "
            f"is {low.long().tolist()}..{high.long().tolist()}; the checkpoint's rank files come "
            "from different saves: load an earlier checkpoint")


def _train(args, engine, state: RunState, iterators, train_log: TrainLog, datasets: list,
           profiler: StepProfiler, tasks=None) -> None:
    """Train, then (at train_iters) evaluate the validation split, save, evaluate the test
    split, as GPT-NeoX does, and print the run's summary."""
    ck, t = args.checkpoint, args.training
    train_iter, valid_iter, test_iter = iterators
    guard = StepGuard.from_args(t)
    summary = RunSummary(args, state.iteration)
    if ck.save and state.iteration == 0 and 0 in (ck.extra_save_iters or ()):
        _save_if_sound(args, engine, state, guard, datasets)  # GPT-NeoX's step-0 checkpoint
    with StopSignals(_plan_on_signal(ck)) as stops:
        saved_at = _train_steps(args, engine, state, train_iter, valid_iter, train_log, datasets,
                                guard, stops, profiler, summary, tasks)
    finished = state.iteration >= t.train_iters  # else exit_interval ended it: no save, as
    # GPT-NeoX exits there (a save iteration saved in the loop)
    evaluated = bool(summary.evals["validation"]) and \
        summary.evals["validation"][-1][0] == state.iteration
    if finished and valid_iter is not None and t.eval_iters and not evaluated:
        _evaluate(args, engine, state, valid_iter, train_log.tracker, summary, tasks=tasks)
    stepped = state.iteration != summary.start_iteration  # else the loaded checkpoint is it
    if ck.save and finished and saved_at != state.iteration and state.iteration > 0 and stepped:
        _save_if_sound(args, engine, state, guard, datasets)
    test_batches = test_iter() if finished and t.eval_iters else None
    if test_batches is not None:
        _evaluate(args, engine, state, test_batches, train_log.tracker, summary, split="test")
    latest = read_latest(ck.save) if ck.save else None
    checkpoint = f"{os.path.abspath(ck.save)}/{latest}" if latest else None
    rate = None
    if train_log.train_seconds > 0:
        rate = ((state.iteration - summary.start_iteration) * args.derived.train_batch_size
                * args.model.seq_length / train_log.train_seconds)
    if dist.get_rank() == 0:
        summary.finish(state.iteration, train_log.train_seconds, train_log.tflops_per_gpu(rate),
                       checkpoint, write=True)


def _train_steps(args, engine, state: RunState, train_iter, valid_iter, train_log: TrainLog,
                 datasets: list, guard: StepGuard, stops: StopSignals,
                 profiler: StepProfiler, summary: RunSummary, tasks=None) -> int | None:
    """Train to train_iters (or exit_interval); returns the iteration last saved. A signal
    ends it after the step with a checkpoint (Preempted)."""
    t, ck = args.training, args.checkpoint
    gbs = args.derived.train_batch_size
    saved_at = None
    interval_start = time.perf_counter()
    scaling = engine.engine.fp16_enabled() and engine.engine.dynamic_loss_scale()
    compiling = args.model.torch_compile  # the first step compiles the layers: said once
    while state.iteration < t.train_iters:
        train_log.before_step(state.iteration + 1)
        skipped = engine.engine.skipped_steps
        step_start = time.perf_counter()
        with profiler.step(state.iteration + 1), watchdog.phase("train step",
                                                                state.iteration + 1):
            loss, metrics = _scaled_step(args, engine, train_iter, state.iteration + 1)
        if compiling:
            compiling = False
            log.info("torch_compile: the first step compiled %d graph(s) in %.1f s",
                     graphs_compiled(), time.perf_counter() - step_start)
        state.iteration += 1
        state.consumed_train_samples += gbs
        state.interval_losses.append(loss)
        state.interval_metrics.append(metrics)
        state.last_loss = loss
        skipped = engine.engine.skipped_steps > skipped
        state.interval_applied.append(not skipped)
        verdict = guard.after_step(state.iteration, loss, skipped, overflow=skipped and scaling)
        if verdict.action != "ok" and _bad_step(args, engine, state, verdict):
            continue  # rolled back: the iteration count is the checkpoint's again
        if train_log.is_logged(state.iteration):
            elapsed = time.perf_counter() - interval_start
            train_log.log(engine, state.iteration, state.interval_losses,
                          state.consumed_train_samples, elapsed, train_iter.take_wait(),
                          state.interval_metrics, state.interval_applied)
            state.clear_interval()
            interval_start = time.perf_counter()
        if t.eval_interval and state.iteration % t.eval_interval == 0 and valid_iter is not None:
            _evaluate(args, engine, state, valid_iter, train_log.tracker, summary, tasks=tasks)
            interval_start = time.perf_counter()
        if ck.save and should_save(state.iteration, ck.checkpoint_factor, ck.checkpoint_scale,
                                   ck.extra_save_iters):
            if _save_if_sound(args, engine, state, guard, datasets):
                saved_at = state.iteration
            interval_start = time.perf_counter()
        if t.exit_interval and state.iteration % t.exit_interval == 0 and \
                state.iteration < t.train_iters:
            print_rank_0(_exit_line(args, state.iteration, saved_at))
            break
        with watchdog.phase("stop check", state.iteration):
            signum = stops.agreed()
        if signum:
            _stop_on_signal(args, engine, state, guard, datasets, signum, saved_at)
    return saved_at


def _exit_line(args, iteration: int, saved_at: int | None) -> str:
    """exit_interval's stop, and where a run goes on from: GPT-NeoX exits there without a
    checkpoint beyond the iteration's scheduled one, and so does this."""
    head = f"exiting at iteration {iteration} (exit_interval={args.training.exit_interval})"
    if saved_at == iteration:
        return head + " after its scheduled checkpoint"
    save = args.checkpoint.save
    latest = read_latest(save) if save else None
    return (head + " without a checkpoint of its own, as GPT-NeoX does"
            + (f"; a run goes on from {save}/{latest}" if latest else ""))


def _scaled_step(args, engine, train_iter, iteration: int):
    """run_step; with fp16, gradients that overflow at `min_loss_scale` stop the run
    (DeepSpeed raises a bare Exception there, which reads as a crash)."""
    try:
        return run_step(engine, train_iter, train=True)
    except Exception as err:
        if "loss scale already at minimum" not in str(err):
            raise
        floor = engine.engine.dynamic_loss_scale_args()["min_scale"]
        raise TrainingStopped(
            f"training stopped: iteration {iteration}: the gradients overflow fp16 at its "
            f"minimum loss scale (fp16.min_loss_scale {floor}), so no step can be applied. "
            f"Lower the learning rate, or train in bf16. {_last_good(args)}") from None


def _plan_on_signal(ck) -> str:
    """What a stop signal makes the run do, as its warning says it."""
    if not ck.save:
        return "stopping after this step, without a checkpoint ('save' is not set)"
    if not ck.save_on_signal:
        return "stopping after this step, without a checkpoint (save_on_signal is false)"
    return "stopping after this step, with a checkpoint"


def _stop_on_signal(args, engine, state: RunState, guard, datasets, signum: int,
                    saved_at: int | None) -> None:
    """Save (save_on_signal) and raise Preempted naming the iteration and the checkpoint."""
    ck = args.checkpoint
    if ck.save and ck.save_on_signal and saved_at != state.iteration:
        _save_if_sound(args, engine, state, guard, datasets)
    latest = read_latest(ck.save) if ck.save else None
    where = (f"checkpoint {os.path.abspath(ck.save)}/{latest}" if latest
             else "no checkpoint saved")
    name = signal.Signals(signum).name
    raise Preempted(signum, f"{'interrupted' if name == 'SIGINT' else 'preempted'} ({name}) at "
                            f"iteration {state.iteration}; {where}")


def _bad_step(args, engine, state: RunState, verdict) -> bool:
    """Act on the guard's verdict on a bad step: report it, stop the run (TrainingStopped), or
    roll back to the newest good checkpoint (True) keeping the data position, so the batches
    since that checkpoint are skipped."""
    if verdict.action == "stop":
        raise TrainingStopped(f"training stopped: {verdict.message}. {_last_good(args)}")
    if verdict.action != "rollback":
        if dist.get_rank() == 0:
            log.warning("%s", verdict.message)
        return False
    root = args.checkpoint.save
    good = newest_good_iteration(root) if root else None
    if good is None:
        raise TrainingStopped(f"training stopped: {verdict.message}; bad_step_policy is rollback "
                              "but there is no good checkpoint to roll back to")
    consumed = state.consumed_train_samples, state.consumed_valid_samples
    section = dataclasses.replace(args.checkpoint, load=root, iteration=good, finetune=False,
                                  no_load_optim=False, no_load_rng=False)
    load_checkpoint(engine, section)
    skipped = state.iteration - good
    state.iteration = good
    state.consumed_train_samples, state.consumed_valid_samples = consumed
    state.clear_interval()
    if dist.get_rank() == 0:
        log.warning("%s; rolled back to %s/global_step%d, skipping the %d batches since",
                    verdict.message, root, good, skipped)
    return True


def _save_if_sound(args, engine, state: RunState, guard, datasets: list) -> bool:
    """Save unless the last step was bad or a weight is not finite: `latest` never moves to a
    checkpoint that could not be resumed usefully. Collective."""
    why = None if guard.healthy else f"the last step was bad ({guard.problem})"
    if why is None and not weights_finite(engine):
        why = "a weight is inf or NaN"
    if why is not None:
        if dist.get_rank() == 0:
            log.warning("not saving a checkpoint at iteration %d: %s; %s", state.iteration, why,
                        _last_good(args))
        return False
    check_datasets_unchanged(*datasets)  # A16: the files did not change under us
    with watchdog.phase("checkpoint save", state.iteration):
        save_checkpoint(engine, args.checkpoint, state.iteration, state.client_state())
    return True


def _last_good(args) -> str:
    root = args.checkpoint.save
    good = newest_good_iteration(root) if root else None
    return (f"the newest good checkpoint is {root}/global_step{good}" if good is not None
            else "no good checkpoint was saved")


def _evaluate(args, engine, state: RunState, data_iter, tracker, summary: RunSummary,
              split: str = "validation", tasks=None) -> None:
    """eval_iters batches of the validation split (where it stands) or of the test split
    (from its start), logged as val_loss/val_ppl or test_loss/test_ppl; with `tasks` (a
    TaskEvaluator, eval_tasks set) the lm-eval tasks too."""
    results = []
    for _ in range(args.training.eval_iters):
        with watchdog.phase("eval step", state.iteration):
            results.append(run_step(engine, data_iter, train=False))
        if split == "validation":
            state.consumed_valid_samples += args.derived.train_batch_size
    loss = sum(r.loss for r in results) / len(results)
    ppl = float(np.exp(min(loss, 50.0)))
    summary.add_eval(split, state.iteration, loss)
    short = "val" if split == "validation" else "test"
    when = (f"at iteration {state.iteration}" if split == "validation"
            else f"at the end of training (iteration {state.iteration})")
    objective = engine.objective
    extra = interval_means(objective, [r.metrics for r in results])
    language_model = objective is None or objective.name == "normal"
    line = f" {split} {when} | {short}_loss {loss:.4f}"  # the objective's loss
    line += f" | {short}_ppl {ppl:.2f}" if language_model else ""
    line += "".join(f" | {part.strip(' |')}" for part in
                    console_metrics(objective, extra).split(" | ") if part.strip(" |"))
    values = {f"{short}_loss": loss, **({f"{short}_ppl": ppl} if language_model else {})}
    tracker.log({**values, **{f"{split}/{k}": v for k, v in extra.items()}}, state.iteration,
                console=line)
    if tasks is not None:
        from megatron.evaluation.during_training import console_line

        with watchdog.phase("eval step", state.iteration):
            metrics = tasks.run()
        tracker.log(metrics, state.iteration, console=console_line(state.iteration, metrics))
