"""Real training runs through `python deepy.py train.py configs/tiny.yml`: DeepSpeed launcher,
gloo processes, the built-in corpus (the layout, precision and Llama runs with their workers
forked in-process, tests/runs.py). Each asserts what a user reads afterwards: the loss trace,
validation lines, checkpoint files, and the iteration a resumed run starts from."""

import json
import math
import re
from pathlib import Path

import pytest

from megatron.data.loaders import available_cpus
from megatron.launching.merge import split_line
from megatron.neox_arguments import NeoXArgs
from tests.runs import deepy, explain, launch_in_process, read_metrics, tiny_overrides


def records(run):
    return [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]


def losses(records):
    return [r["lm_loss"] for r in records]


def assert_learned(train_records, min_drop=0.5):
    first, last = losses(train_records)[0], losses(train_records)[-1]
    assert last < first - min_drop, f"loss did not fall: {losses(train_records)}"


def test_two_processes_train_evaluate_save_and_resume(small_data, tmp_path):
    prefix, tok = small_data
    run = tmp_path / "run"
    # one loader worker more than the CPUs: a warning both ranks print, three times each
    over = tiny_overrides(prefix, tok, run, train_iters=30, tensorboard_dir=str(run / "tb"),
                          use_wandb=True, num_workers=available_cpus() + 1)
    port = next(o.split("=")[1] for o in over if o.startswith("master_port="))
    proc = deepy("train.py", "configs/tiny.yml", *over, env={"WANDB_MODE": "offline"})
    assert proc.returncode == 0, explain(proc)
    # nothing left behind in shared memory (DeepSpeed's CPU all-reduce buffers are 69 MB each)
    assert not list(Path("/dev/shm").glob(f"*_{port}_*"))
    train, val = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert [r["iteration"] for r in val] == [10, 20, 30]
    assert_learned(train)
    assert val[-1]["val_loss"] < val[0]["val_loss"]
    for r in train:
        assert r["tokens_per_sec"] > 0 and 0 < r["learning_rate"] <= 2e-3 and r["grad_norm"] > 0
        assert r["data_wait_ms"] >= 0 and r["iteration_time_ms"] > r["data_wait_ms"]
        # neither peak_theoretical_tflops nor log_grad_norm is set
        assert "mfu" not in r and "model_tflops_per_gpu" not in r
        assert not [k for k in r if k.startswith("gradient_norms/")]
    assert "MFU" not in proc.stdout
    # one line per interval: DeepSpeed's own loss line and pipeline banners are debug output
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(" iteration ")]
    assert len(lines) == 6 and all(" | mem " in ln and ", ETA " in ln for ln in lines), lines
    assert lines[-1].endswith("ETA 0:00:00")
    for noise in ("steps: ", "SEED_LAYERS", "Using topology", "stage=0 layers=",
                  "Setting accelerator to CPU", "--neox_args"):
        assert noise not in proc.stdout + proc.stderr, noise
    # each warning once, naming the ranks that printed it
    warnings = [split_line(ln)[2] for ln in proc.stderr.splitlines() if "WARNING" in ln]
    assert len(warnings) == len(set(warnings)), warnings
    clamp = [ln for ln in proc.stderr.splitlines() if "available CPUs; using" in ln]
    assert len(clamp) == 1 and clamp[0].startswith("[ranks 0-1] "), clamp
    ckpt = run / "ckpt"
    assert (ckpt / "latest").read_text().strip() == "global_step30"
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step10", "global_step20",
                                                      "global_step30", "latest"]
    assert (ckpt / "global_step30" / "mp_rank_00_model_states.pt").stat().st_size > 0
    # the resolved config beside the checkpoint reloads to what the run used
    saved = NeoXArgs.from_yml_saved(ckpt / "global_step30" / "config.yml")
    assert saved == NeoXArgs.from_ymls(["configs/tiny.yml"], over)
    assert saved.train_iters == 30 and saved.seq_length == 64 and saved.data_path == prefix
    # the end of the run: the test split evaluated, the summary printed and written
    assert " test at the end of training (iteration 30) | test_loss " in proc.stdout
    assert f"  checkpoint: {ckpt}/global_step30\n" in proc.stdout
    summary = json.loads((run / "logs" / "run_summary.json").read_text())
    assert summary["end_iteration"] == 30 and summary["tokens"] == 30 * 16 * 64
    assert summary["final_val_loss"] == val[-1]["val_loss"]
    assert summary["best_val_loss"] == min(r["val_loss"] for r in val)
    test_record = [r for r in records(run) if "test_loss" in r]
    assert [r["iteration"] for r in test_record] == [30]
    assert summary["test_loss"] == test_record[0]["test_loss"]
    assert f"run finished at iteration 30/30: 30 iterations, {30 * 16 * 64:,} tokens in " \
        in proc.stdout
    assert list((run / "tb").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert list((run / "logs").glob("wandb/offline-run-*")), "no offline wandb run"

    # a longer run decays over more iterations: as in GPT-NeoX, the changed schedule must be
    # chosen explicitly
    longer = tiny_overrides(prefix, tok, run, train_iters=40)
    refused = deepy("train.py", "configs/tiny.yml", *longer)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert ("decay iterations (lr_decay_iters / train_iters): checkpoint 30, config 40). Set "
            "override_lr_scheduler: true") in refused.stderr, explain(refused)
    resumed = deepy("train.py", "configs/tiny.yml", *longer, "override_lr_scheduler=true")
    assert resumed.returncode == 0, explain(resumed)
    assert "from iteration 30 to 40" in resumed.stdout
    train2, _ = read_metrics(run / "logs")
    assert [r["iteration"] for r in train2][len(train):] == [35, 40]
    assert train2[-1]["consumed_samples"] == 40 * 16
    # the resumed run continues the trained model, not a fresh one
    assert train2[-1]["lm_loss"] < train[0]["lm_loss"] - 0.5
    assert (run / "ckpt" / "latest").read_text().strip() == "global_step40"


def test_mfu_and_per_parameter_gradient_norms_when_asked_for(small_data, tmp_path):
    """peak_theoretical_tflops adds model TFLOP/s per GPU and MFU (percent) to every training
    record and line; log_grad_norm adds each parameter's gradient norm, whose squares add up to
    the global grad_norm squared (both unclipped). Both reach TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from megatron.model.config import model_config_from_args
    from megatron.neox_arguments import padded_vocab_size
    from megatron.tokenizer import build_tokenizer
    from megatron.training.flops import flops_per_token

    prefix, tok = small_data
    run = tmp_path / "run"
    over = tiny_overrides(prefix, tok, run, train_iters=10, eval_interval=100,
                          peak_theoretical_tflops=0.5, log_grad_norm=True,
                          tensorboard_dir=str(run / "tb"), use_wandb=True,
                          wandb_host="https://wandb.example.test")
    proc = deepy("train.py", "configs/tiny.yml", *over, env={"WANDB_MODE": "offline"})
    assert proc.returncode == 0, explain(proc)
    train, _ = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [5, 10]

    args = NeoXArgs.from_ymls(["configs/tiny.yml"], over)
    vocab = padded_vocab_size(build_tokenizer("HFTokenizer", tok).vocab_size,
                              args.model.make_vocab_size_divisible_by, 1)
    per_token = flops_per_token(model_config_from_args(args, vocab), args.model.seq_length)
    for r in train:
        tflops = per_token * r["tokens_per_sec"] / 2 / 1e12  # two processes
        assert r["model_tflops_per_gpu"] == pytest.approx(tflops, rel=1e-9)
        assert r["mfu"] == pytest.approx(100 * tflops / 0.5, rel=1e-9)
        norms = {k: v for k, v in r.items() if k.startswith("gradient_norms/")}
        assert len(norms) == 4 * 12 + 1 + 2 + 1  # 4 layers, embedding, final norm, head
        assert "gradient_norms/0.word_embeddings.weight" in norms
        # grad_norm adds fp32 per-tensor norms (~1e-5 relative); the norms here are summed in
        # fp64. A parameter counted twice or a shard missed moves the sum by far more.
        assert math.sqrt(sum(v * v for v in norms.values())) == pytest.approx(r["grad_norm"],
                                                                              rel=1e-4)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(" iteration     10/10"))
    assert f"MFU {train[1]['mfu']:.2f}%" in line and "model TFLOP/s per GPU" in line

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    # GPT-NeoX's tags, so dashboards made for its runs work
    assert {"runtime/model_flops_utilization", "runtime/flops_per_sec_per_gpu", "train/lm_loss",
            "train/learning_rate", "runtime/tokens_per_sec", "validation/lm_loss",
            "test/lm_loss", "gradient_norms/0.word_embeddings.weight"} <= tags
    flops = [e.value for e in events.Scalars("runtime/flops_per_sec_per_gpu")]
    assert flops == pytest.approx([r["model_tflops_per_gpu"] * 1e12 for r in train], rel=1e-6)
    # a wandb_host other than the default runs (offline here; tests/monitoring checks that it
    # reaches wandb's settings)
    assert list((run / "logs").glob("wandb/offline-run-*/run-*.wandb"))


@pytest.mark.parametrize("layout", [
    {"pipe_parallel_size": 2},
    {"pipe_parallel_size": 0, "zero_optimization": "{stage: 1}"},
    {"pipe_parallel_size": 0, "zero_optimization": "{stage: 3}"},
], ids=["pp2", "zero1", "zero3"])
def test_parallel_layouts_train_and_save(small_data, tmp_path, layout):
    prefix, tok = small_data
    run = tmp_path / "run"
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, run, **layout, checkpoint_factor=20))
    assert proc.returncode == 0, explain(proc)
    train, val = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [5, 10, 15, 20] and len(val) == 2
    assert_learned(train)
    step_dir = run / "ckpt" / "global_step20"
    names = {p.name for p in step_dir.iterdir()}
    if layout.get("pipe_parallel_size") == 2:
        assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= names
    else:
        assert any(n.startswith("zero_pp_rank_1_") and "optim_states" in n for n in names), names
    assert "config.yml" in names


def test_bf16_single_process_saving_on_the_log_scale(small_data, tmp_path):
    """bf16 on one process; checkpoints on GPT-NeoX's log scale with factor 1.5 (at int(1.5^k):
    1, 2, 3, 5, 7, 11, 17) and at the last iteration."""
    prefix, tok = small_data
    run = tmp_path / "run"
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, run, num_gpus=1, bf16="{enabled: true}",
                                             checkpoint_factor=1.5, checkpoint_scale="log"))
    assert proc.returncode == 0, explain(proc)
    train, _ = read_metrics(run / "logs")
    assert_learned(train, min_drop=0.3)
    assert sorted(int(p.name.removeprefix("global_step")) for p in (run / "ckpt").glob(
        "global_step*")) == [1, 2, 3, 5, 7, 11, 17, 20]


@pytest.mark.slow
def test_bf16_with_fp32_gradient_accumulation_trains(small_data, tmp_path):
    """Llemma's precision (GPT-NeoX's data_types: {grad_accum_dtype: fp32} with bf16 and ZeRO
    stage 1, which runs DeepSpeed's bf16 optimizer): 2 data-parallel processes accumulating 2
    micro-batches each."""
    prefix, tok = small_data
    run = tmp_path / "run"
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, run, bf16="{enabled: true}",
                                             zero_optimization="{stage: 1}",
                                             train_micro_batch_size_per_gpu=4,
                                             data_types="{grad_accum_dtype: fp32}",
                                             fp32_allreduce=True, train_iters=10,
                                             eval_interval=5))
    assert proc.returncode == 0, explain(proc)
    saved = NeoXArgs.from_yml_saved(run / "ckpt" / "global_step10" / "config.yml")
    assert saved.derived.gradient_accumulation_steps == 2
    assert saved.deepspeed.data_types == {"grad_accum_dtype": "fp32"}
    train, val = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [5, 10]
    assert_learned(train, min_drop=0.3)
    assert val[-1]["val_loss"] < val[0]["val_loss"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only refusal")
def test_fp16_on_cpu_is_refused_with_what_to_use_instead(small_data, tmp_path):
    prefix, tok = small_data
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(prefix, tok, tmp_path, num_gpus=1, fp16="{enabled: true}"))
    assert proc.returncode != 0
    assert "fp16 training needs a CUDA GPU" in proc.stderr and "bf16" in proc.stderr, explain(proc)
    assert "Traceback" not in proc.stderr


def test_torch_compile_trains_from_the_config_key(small_data, tmp_path):
    """torch_compile: true through train.py: the start-up line names the compiled layers, the
    run learns and saves."""
    prefix, tok = small_data
    run = tmp_path / "run"
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, run, num_gpus=1, torch_compile=True))
    assert proc.returncode == 0, explain(proc)
    output = proc.stdout + proc.stderr
    assert output.count("torch_compile: 4 transformer layer(s) run through torch.compile") == 1, \
        explain(proc)
    assert "Traceback" not in output and "graph break" not in output.lower(), explain(proc)
    # the layers' one graph, compiled in the first step (validation's eval-mode graph later)
    assert re.search(r"torch_compile: the first step compiled 1 graph\(s\) in \d+\.\d s",
                     output), explain(proc)
    train, _ = read_metrics(run / "logs")
    assert_learned(train, min_drop=0.3)
    assert (run / "ckpt" / "global_step20").is_dir()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only refusal")
def test_torch_compile_with_bf16_on_cpu_is_refused_before_any_worker(small_data, tmp_path):
    prefix, tok = small_data
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(prefix, tok, tmp_path, num_gpus=1, bf16="{enabled: true}",
                                 torch_compile=True))
    assert proc.returncode != 0
    assert "torch_compile: true with bf16 needs a CUDA GPU" in proc.stderr, explain(proc)
    assert "Traceback" not in proc.stderr and not (tmp_path / "logs").exists()


def test_llama_style_config_trains_with_tensor_parallel_gqa(small_data, tmp_path):
    """configs/tiny_llama.yml: rmsnorm, swiglu, rotary, 2 KV heads for 4 query heads, no biases;
    split over 2 tensor-parallel ranks (one KV head each)."""
    prefix, tok = small_data
    run = tmp_path / "run"
    proc = launch_in_process("train.py", "configs/tiny_llama.yml",
                             *tiny_overrides(prefix, tok, run, model_parallel_size=2,
                                             checkpoint_factor=20))
    assert proc.returncode == 0, explain(proc)
    assert "tp=2 pp=1 dp=1" in proc.stdout
    train, val = read_metrics(run / "logs")
    assert_learned(train)
    names = {p.name for p in (run / "ckpt" / "global_step20").iterdir()}
    assert {"layer_01-model_00-model_states.pt", "layer_01-model_01-model_states.pt"} <= names


def test_resume_on_changed_data_is_refused_unless_allowed(tmp_path):
    """A17: the checkpoint records the token files' content; resuming on other files at the same
    path is refused by deepy.py with the differences named, before any worker starts, and
    allow_data_change lets the run continue on purpose."""
    from megatron.data.prepare import prepare_builtin

    first = prepare_builtin(str(tmp_path / "a"), vocab_size=1024, max_documents=800)
    run = tmp_path / "run"
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *tiny_overrides(first.data_prefix, first.vocab_file, run,
                                             train_iters=10, split="80,10,10"))
    assert proc.returncode == 0, explain(proc)
    # the same prefix, rebuilt from fewer documents: other content under the same name
    prepare_builtin(str(tmp_path / "a"), vocab_size=1024, max_documents=700)
    again = tiny_overrides(first.data_prefix, first.vocab_file, run, train_iters=20,
                           split="80,10,10") + ["override_lr_scheduler=true"]
    refused = deepy("train.py", "configs/tiny.yml", *again)
    assert refused.returncode != 0
    assert "the training data differs from the data checkpoint" in refused.stderr, explain(refused)
    assert f"{first.data_prefix}: num_tokens was" in refused.stderr
    assert "Traceback" not in refused.stderr and "launching" not in refused.stderr
    allowed = launch_in_process("train.py", "configs/tiny.yml", *again, "allow_data_change=true")
    assert allowed.returncode == 0, explain(allowed)
    assert "from iteration 10 to 20" in allowed.stdout


def test_the_command_of_a_finished_run_run_again_writes_nothing(trained, tmp_path):
    """A run whose checkpoint is at train_iters and whose summary says it ended there ends at
    once: no second validation at that iteration, no checkpoint rewritten, no metrics or
    summary replaced. Without the summary (the end was cut short) the last evaluations and the
    summary are done, and the checkpoint is still not rewritten."""
    import hashlib
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["ckpt"], run / "ckpt")
    shutil.copytree(trained["ckpt"].parent / "logs", run / "logs")

    def files() -> dict:
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*")) if p.is_file() and p.parent.name != "heartbeats"}

    def again():
        proc = launch_in_process("train.py", "configs/tiny.yml",
                                 *tiny_overrides(trained["data"], trained["tokenizer"], run,
                                                 train_iters=30, num_gpus=1))
        assert proc.returncode == 0, explain(proc)
        return proc

    before = files()
    proc = again()
    assert (f"nothing to train: the checkpoint in {run / 'ckpt'} is at iteration 30, at "
            "train_iters (30); nothing was evaluated or written") in proc.stdout
    assert "launching" not in proc.stdout + proc.stderr  # decided by deepy.py, from the files
    assert "validation at iteration" not in proc.stdout
    assert files() == before  # no checkpoint file touched, no metrics, no run summary

    (run / "logs" / "run_summary.json").unlink()  # the first run was stopped after its save
    checkpoint = {k: v for k, v in before.items() if k.startswith("ckpt/")}
    proc = again()
    assert "its run's last evaluations and summary were not written: doing them now" \
        in proc.stdout
    assert "validation at iteration 30" in proc.stdout
    summary = json.loads((run / "logs" / "run_summary.json").read_text())
    assert summary["end_iteration"] == 30 and summary["final_val_loss"] is not None
    assert {k: v for k, v in files().items() if k.startswith("ckpt/")} == checkpoint
    assert "nothing to train" in again().stdout  # and now it is done
