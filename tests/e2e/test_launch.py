"""The launcher as users meet it: two "nodes" on one machine, workers started by mpirun's
contract, the master port, an unreachable master (A1), and bad input that must end in
one clear line, a non-zero exit and no traceback; the suite's in-process launch against
deepy.py's. Workers started by a real mpirun, srun or pdsh: test_cluster_launchers.py."""

import io
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.runs import (ROOT, SHORT_RUN, clean_env, deepy, explain, free_port, read_metrics,
                        tiny_overrides)


def test_two_nodes_launched_per_node_train_together(small_data, tmp_path):
    prefix, tok = small_data
    run = tmp_path / "run"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    common = ["train.py", "configs/tiny.yml",
              *tiny_overrides(prefix, tok, run, train_iters=10, eval_interval=10, num_gpus=1,
                              hostfile=hostfile, no_ssh=True, master_addr="127.0.0.1",
                              checkpoint_factor=10)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    nodes = [subprocess.Popen([sys.executable, str(ROOT / "deepy.py"), *common, f"node_rank={r}"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    outs = [n.communicate(timeout=300) for n in nodes]
    for node, (out, err) in zip(nodes, outs):
        assert node.returncode == 0, f"exit {node.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    assert "dp=2" in outs[0][0]  # node 0 hosts global rank 0, which prints
    train, val = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [5, 10] and len(val) == 1
    ckpt = run / "ckpt" / "global_step10"
    assert (ckpt / "mp_rank_00_model_states.pt").is_file()


def test_unreachable_master_fails_within_the_timeout_and_says_where(small_data, tmp_path):
    """Only rank 1 of 2 is started: nobody listens at the master port."""
    from megatron.neox_arguments import NeoXArgs

    prefix, tok = small_data
    port = free_port()
    args = NeoXArgs.from_ymls(["configs/tiny.yml"],
                              tiny_overrides(prefix, tok, tmp_path, distributed_timeout_minutes=0.1,
                                             master_port=port))
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py", "--neox_args", args.encode()], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == 1, explain(proc)
    assert (f"rank 1 of world size 2 could not join the process group at master 127.0.0.1:{port} "
            "within 6 s") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 60
    # what deepy.py prints of it: torch's own lines, without the C++ backtraces they carry
    from megatron.launching.merge import WarningMerger

    shown = io.StringIO()
    merger = WarningMerger(shown, [1], cpp_backtraces=False)
    for line in proc.stderr.splitlines():
        merger.feed(1, line)
    merger.close()
    console = shown.getvalue()
    assert "could not join the process group" in console and "frame #" not in console, console


def test_a_busy_master_port_set_explicitly_fails_at_once_and_starts_no_worker(small_data, tmp_path):
    prefix, tok = small_data
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        proc = deepy("train.py", "configs/tiny.yml",
                     *tiny_overrides(prefix, tok, tmp_path / "run", master_port=port), timeout=120)
        took = time.monotonic() - start
    assert proc.returncode == 1, explain(proc)
    assert f"error: master_port {port} is in use on this machine; set master_port=" in proc.stderr
    assert "or leave it unset to pick one" in proc.stderr and "Traceback" not in proc.stderr
    assert "launching" not in proc.stderr and not (tmp_path / "run").exists()  # no worker ran
    assert took < 60


def test_the_default_port_trains_while_29500_is_busy(small_data, tmp_path):
    prefix, tok = small_data
    run = tmp_path / "run"
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 29500))
            busy.listen()
        except OSError:
            pass  # someone else holds it: just as busy
        proc = deepy("train.py", "configs/tiny.yml",
                     *tiny_overrides(prefix, tok, run, master_port="null", **SHORT_RUN))
    assert proc.returncode == 0, explain(proc)
    assert "master 127.0.0.1:" in proc.stderr and "master 127.0.0.1:29500" not in proc.stderr
    train, _ = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [2, 4]


def test_workers_started_with_only_mpirun_variables_join(small_data, tmp_path):
    """mpirun's contract, exercised by starting two workers with the variables it sets (and a
    stale RANK/WORLD_SIZE): GPT-NeoX's deepspeed_mpi has Open MPI's win, master_addr and
    master_port come from the config, as mpirun passes neither; they form one world of 2.
    srun's contract: test_cluster_launchers.py, through DeepSpeed's own srun command."""
    from megatron.neox_arguments import NeoXArgs

    prefix, tok = small_data
    run = tmp_path / "run"
    port = free_port()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    overrides = tiny_overrides(prefix, tok, run, hostfile=hostfile, launcher="openmpi",
                               deepspeed_mpi=True, master_addr="127.0.0.1", master_port=port,
                               **SHORT_RUN)
    envs = [clean_env(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE="2",
                      OMPI_COMM_WORLD_LOCAL_RANK=str(r), OMPI_COMM_WORLD_LOCAL_SIZE="2",
                      RANK="0", LOCAL_RANK="0", WORLD_SIZE="1") for r in (0, 1)]
    encoded = NeoXArgs.from_ymls(["configs/tiny.yml"], overrides).with_world_size(2).encode()
    workers = [subprocess.Popen([sys.executable, "train.py", "--neox_args", encoded], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for env in envs]
    outs = [w.communicate(timeout=300) for w in workers]
    for worker, (out, err) in zip(workers, outs):
        assert worker.returncode == 0, f"exit {worker.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    assert "dp=2" in outs[0][0]  # one world of two data-parallel ranks, printed by rank 0
    assert f"world of 2 ranks from Open MPI's variables; master 127.0.0.1:{port}" in outs[0][1]
    train, _ = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [2, 4]


@pytest.mark.parametrize("argv,message", [
    (["train.py", "configs/does-not-exist.yml"], "configs/does-not-exist.yml"),
    (["train.py", "configs/tiny.yml", "hidden_sise=64"], "hidden_size"),
    (["train.py", "configs/tiny.yml", "num_layers=four"], "num_layers"),
    (["train.py", "configs/tiny.yml", "num_gpus=3", "pipe_parallel_size=2"], "pipe_parallel_size(2)"),
    (["train.py", "configs/tiny.yml", "hostfile=/nonexistent/hostfile"], "hostfile /nonexistent/hostfile"),
    (["nope.py", "configs/tiny.yml"], f"script nope.py does not exist in {ROOT}; usage: "),
    (["train.py", "configs/tiny.yml", "no_ssh=true", "node_rank=1"],
     "no_ssh and node_rank set without a hostfile"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path=/nonexistent/corpus"],
     "data_path: indexed dataset '/nonexistent/corpus' needs both /nonexistent/corpus.idx and "
     "/nonexistent/corpus.bin"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path={data}",
      "vocab_file=/nonexistent/tokenizer.json"], "/nonexistent/tokenizer.json"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml", "load=null", "{tok}"],
     "generation and evaluation read a trained checkpoint, but 'load' is not set; set load to "
     "the directory the training run saved to"),
    (["eval.py", "configs/tiny.yml", "eval_tasks=[tests/evaluation/tasks/tiny_mc.yaml]",
      "load=/nonexistent/ckpt", "{tok}"],
     "checkpoint directory /nonexistent/ckpt (config key 'load') does not exist"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml",
      "vocab_file=/nonexistent/tokenizer.json"],
     "tokenizer JSON file (vocab_file) /nonexistent/tokenizer.json does not exist"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml",
      "text_gen_type=input-file", "sample_input_file=/nonexistent/prompts.txt", "{tok}"],
     "sample_input_file /nonexistent/prompts.txt does not exist"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml", "maximum_tokens=200",
      "{tok}"],
     "maximum_tokens(200) must be below max_position_embeddings(128)"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml", "maximum_tokens=100",
      "text_gen_type=input-file", "sample_input_file={prompts}", "{tok}"],
     "tokens: prompt tokens + maximum_tokens(100) must not exceed max_position_embeddings(128); "
     "shorten the prompt to at most 28 tokens"),
    (["eval.py", "configs/tiny.yml", "{tok}"], "eval.py needs eval_tasks"),
    (["eval.py", "configs/tiny.yml", "eval_tasks=[/nonexistent/task.yaml]", "{tok}"],
     "task file /nonexistent/task.yaml (in eval_tasks) does not exist"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path={data}", "save=/proc/neox-ck"],
     "save: cannot create /proc/neox-ck: /proc is not writable"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path={data}", "log_dir=README.md"],
     "log_dir: README.md is a file, not a directory; choose another path"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path={data}",
      "eval_tasks=[/nonexistent/task.yaml]"],
     "task file /nonexistent/task.yaml (in eval_tasks) does not exist"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml",
      "sample_output_file=README.md/samples.jsonl", "{tok}"],
     "sample_output_file: README.md is a file, not a directory"),
    (["generate.py", "configs/tiny.yml", "configs/text_generation.yml",
      "sample_output_file=docs", "{tok}"],
     "sample_output_file docs is a directory: give the path of the JSON-lines file to write, "
     "e.g. docs/samples.jsonl"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path={data}",
      "bf16={enabled: 'false'}"],
     "bf16.enabled must be true or false, but it is 'false' (str); write it without quotes."),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path={data}", "split=998,1,1"],
     "the valid split holds 179 tokens (1 sample of seq_length + 1 = 129 tokens), fewer than "
     "one global batch of 16 samples; give the valid split more data"),
    (["train.py", "configs/tiny.yml", "num_gpus=1", "data_path=null", "{tok}"],
     "no data given: set data_path, or train_data_paths"),
    (["eval.py", "configs/tiny.yml", "eval_tasks=[tests/evaluation/tasks/tiny_mc.yaml]",
      "load=README.md", "{tok}"],
     "checkpoint directory README.md (config key 'load') is a file: give the directory a run "
     "saved to"),
], ids=["missing-config", "unknown-key", "wrong-type", "impossible-degrees", "missing-hostfile",
        "missing-script", "no-ssh-without-hostfile", "missing-data", "missing-vocab-file",
        "generate-without-load", "eval-of-a-missing-checkpoint", "generate-missing-vocab-file",
        "generate-missing-prompt-file", "generate-beyond-the-context",
        "generate-a-prompt-too-long", "eval-without-tasks", "eval-missing-task-file",
        "unwritable-save", "log-dir-a-file", "missing-task-file-in-training",
        "sample-output-under-a-file", "sample-output-a-directory", "quoted-bf16-switch",
        "a-split-smaller-than-a-batch", "no-data", "load-a-file"])
def test_bad_input_is_one_clear_error(argv, message, small_data, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a short prompt\n" + "the history of the river " * 30 + "\n")
    argv = [a.replace("{data}", small_data[0]).replace("{prompts}", str(prompts))
            .replace("{tok}", f"vocab_file={small_data[1]}") for a in argv]
    proc = deepy(*argv, timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr, explain(proc)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "worker(s):" not in proc.stderr  # decided in deepy.py: no "launching N worker(s)"
    assert [line.split(":")[0] for line in proc.stderr.splitlines()
            if line.startswith("error")] == ["error"], explain(proc)  # one line, not per rank


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text('{\n  "num_layers": 2,\n  "hidden_size": [64,\n}\n')
    proc = deepy("train.py", "configs/tiny.yml", str(bad), timeout=60)
    assert proc.returncode != 0
    assert str(bad) in proc.stderr and "line" in proc.stderr, explain(proc)
    assert "Traceback" not in proc.stderr


def test_the_suites_in_process_launch_trains_and_refuses_as_deepy_does(small_data, tmp_path):
    """tests/runs.py's launch_in_process (workers forked from the test session's fork server),
    which the tests of what workers compute use in place of deepy.py: the same losses and the
    same checkpoint bit for bit, and the same error line for a launch deepy.py refuses."""
    from tests.checkpointing.test_resume_e2e import assert_same_state
    from tests.runs import launch_in_process

    prefix, tok = small_data
    runs = {}
    for name, start in (("deepy", deepy), ("in-process", launch_in_process)):
        run = tmp_path / name
        proc = start("train.py", "configs/tiny.yml", *tiny_overrides(
            prefix, tok, run, num_gpus=2, hidden_dropout=0.1, **SHORT_RUN))
        assert proc.returncode == 0, explain(proc)
        assert "dp=2" in proc.stdout, explain(proc)
        runs[name] = run
    want, got = (read_metrics(runs[name] / "logs")[0] for name in ("deepy", "in-process"))
    assert [r["lm_loss"] for r in got] == [r["lm_loss"] for r in want] and len(want) == 2
    assert_same_state(runs["in-process"] / "ckpt" / "global_step4",
                      runs["deepy"] / "ckpt" / "global_step4")
    refused = [start("train.py", "configs/tiny.yml", *tiny_overrides(
        prefix, tok, tmp_path / "refused", num_gpus=3, model_parallel_size=2))
        for start in (deepy, launch_in_process)]
    errors = [[line for line in proc.stderr.splitlines() if line.startswith("error")]
              for proc in refused]
    assert [proc.returncode for proc in refused] == [1, 1]
    assert errors[0] == errors[1] and len(errors[0]) == 1, errors
