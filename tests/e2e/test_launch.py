"""The launcher as users meet it: two "nodes" on one machine, an unreachable master (A1), and
bad input that must end in one clear line, a non-zero exit and no traceback."""

import os
import subprocess
import sys
import time

import pytest

from tests.runs import ROOT, deepy, explain, free_port, read_metrics, tiny_overrides


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


@pytest.mark.parametrize("argv,message", [
    (["train.py", "configs/does-not-exist.yml"], "configs/does-not-exist.yml"),
    (["train.py", "configs/tiny.yml", "hidden_sise=64"], "hidden_size"),
    (["train.py", "configs/tiny.yml", "num_layers=four"], "num_layers"),
    (["train.py", "configs/tiny.yml", "num_gpus=3", "pipe_parallel_size=2"], "pipe_parallel_size(2)"),
    (["train.py", "configs/tiny.yml", "hostfile=/nonexistent/hostfile"], "hostfile /nonexistent/hostfile"),
    (["nope.py", "configs/tiny.yml"], "script nope.py does not exist"),
], ids=["missing-config", "unknown-key", "wrong-type", "impossible-degrees", "missing-hostfile",
        "missing-script"])
def test_bad_input_is_one_clear_error(argv, message):
    proc = deepy(*argv, timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr, explain(proc)
    assert "Traceback" not in proc.stderr + proc.stdout


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text('{\n  "num_layers": 2,\n  "hidden_size": [64,\n}\n')
    proc = deepy("train.py", "configs/tiny.yml", str(bad), timeout=60)
    assert proc.returncode != 0
    assert str(bad) in proc.stderr and "line" in proc.stderr, explain(proc)
    assert "Traceback" not in proc.stderr
