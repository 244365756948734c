"""The pdsh launch's pieces without ssh: the plan, the command each node runs, what it exports,
the node launcher's share of the ranks, how pdsh's and the node launchers' reports read, and (a real pdsh,
to hosts that do not resolve) the check that every host answers over ssh.
tests/e2e/test_pdsh_failures.py runs it for real over an sshd of the test's own."""

import shlex
import shutil
import signal

import pytest

from megatron.launcher import CONFIG_FLAG, plan_launch
from megatron.launching import pdsh
from megatron.launching.node import decode_spec, node_launch
from tests.runs import clean_env, deepy
from tests.test_launcher import args


def test_a_hostfile_of_several_nodes_is_launched_by_pdsh_with_the_node_launcher(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(pdsh.shutil, "which", lambda name: f"/usr/bin/{name}")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=2\nn1 slots=2\nn2 slots=2\n")
    plan = plan_launch(args(hostfile=hostfile, num_gpus=2, exclude="n1", master_addr="10.0.0.1",
                            signal_grace_seconds=90), "train.py", python="py")
    assert plan.argv[0] == "train.py" and plan.argv[1] == CONFIG_FLAG  # one worker's command
    assert plan.pdsh.hosts == {"n0": [0, 1], "n2": [0, 1]} and plan.world_size == 4
    assert (plan.pdsh.master_addr, plan.pdsh.master_port, plan.pdsh.grace_seconds) == \
           ("10.0.0.1", 29500, 90)


def test_without_pdsh_the_launch_is_refused_saying_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(pdsh.shutil, "which", lambda name: None)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=1\nn1 slots=1\n")
    with pytest.raises(FileNotFoundError, match=r"launcher 'pdsh' needs pdsh .*apt-get install "
                                                r"pdsh.*or set launcher to openmpi or slurm"):
        plan_launch(args(hostfile=hostfile, num_gpus=1), "train.py")


def test_each_node_runs_the_node_launcher_with_its_rank_in_this_directory():
    launch = pdsh.PdshLaunch({"a": [0, 1], "b": [0, 1, 2]}, "10.0.0.1", 29500, 60.0)
    command = pdsh.node_command(launch, "abc123", ["train.py", CONFIG_FLAG, "BLOB"],
                                {"OMP_NUM_THREADS": "4", "PYTHONPATH": "/x y"}, python="/venv/py",
                                cwd="/work dir")
    assert command.startswith("export OMP_NUM_THREADS=4; export PYTHONPATH='/x y'; "
                              "cd '/work dir' && exec /venv/py -u -m megatron.launching.node "
                              "--node-rank=%n --spec=")
    words = shlex.split(command.split(" && exec ")[1])
    assert words[-4:] == ["--", "train.py", CONFIG_FLAG, "BLOB"]
    spec = decode_spec(next(w for w in words if w.startswith("--spec="))[len("--spec="):])
    assert spec["launch_id"] == "abc123" and spec["grace"] == 60.0
    # ranks numbered in hostfile order, as DeepSpeed does: b holds 2, 3, 4
    second = node_launch(spec, 1)
    assert (second.host, second.ranks, second.world_size, second.nnodes) == ("b", (2, 3, 4), 5, 2)
    assert (second.master_addr, second.master_port) == ("10.0.0.1", 29500)
    with pytest.raises(ValueError, match=r"node rank 2 is not in \[0, 2\)"):
        node_launch(spec, 2)
    assert pdsh.pdsh_argv(launch.hosts, command)[:6] == ["pdsh", "-S", "-f", "1024", "-w", "a,b"]
    assert pdsh.signal_command("TERM", "abc123", python="py") == \
        "py -m megatron.launching.node --node-rank=%n --signal=TERM --launch-id=abc123"


def test_nodes_get_the_startup_variables_and_deepspeed_env_files(tmp_path, monkeypatch):
    exports = pdsh.node_exports({"OMP_NUM_THREADS": "2"}, {
        "PYTHONPATH": "/src", "NCCL_SOCKET_IFNAME": "eth0", "HOME": "/root", "HF_TOKEN": "x"})
    assert exports == {"PYTHONPATH": "/src", "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "2"}
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / ".deepspeed_env").write_text("NCCL_IB_DISABLE=1\n# a comment\nWANDB_API_KEY=k1\n")
    (work / ".deepspeed_env").write_text("WANDB_API_KEY=k2\n")
    assert pdsh.deepspeed_env_files(work) == {"NCCL_IB_DISABLE": "1", "WANDB_API_KEY": "k2"}
    (work / ".deepspeed_env").write_text("oops\n")
    with pytest.raises(ValueError, match=r"\.deepspeed_env line 1: 'oops' is not KEY=VALUE"):
        pdsh.deepspeed_env_files(work)


def test_pdsh_reports_read_as_one_line_and_the_first_death_sets_the_status():
    nodes = pdsh._Nodes(pdsh.PdshLaunch({"a": [0], "b": [0]}, "a", 29500, 60.0), "id", {})
    assert nodes.line("b: [rank 1] iteration 5") is None  # not a report: printed as it is
    assert nodes.line("b: worker rank 1 (local rank 0) on b died: killed by SIGKILL") is None
    assert nodes.first_failure == 128 + signal.SIGKILL
    assert nodes.line("pdsh@head: a: ssh exited with exit code 1") == \
        "node a ended with exit status 1"
    assert nodes.first_failure == 137  # rank 0's error followed the death of rank 1
    shared = pdsh._Nodes(pdsh.PdshLaunch({"a": [0, 1]}, "a", 29500, 60.0), "id", {})
    assert shared.line("a: worker ranks 0-1 (local ranks 0-1) on a died: exited with status "
                       "1") is None
    assert shared.first_failure == 1  # two workers that died alike, in one line
    line, status = pdsh.describe_node_exit("pdsh@head: c: ssh exited with exit code 255")
    assert status == 255 and "check passwordless ssh to c (`ssh c hostname`)" in line
    calm = pdsh._Nodes(pdsh.PdshLaunch({"a": [0]}, "a", 29500, 60.0), "id", {})
    assert calm.line("pdsh@head: a: ssh exited with exit code 143") == ""  # a saved stop: quiet


@pytest.mark.skipif(shutil.which("pdsh") is None, reason="pdsh is not installed (apt-get install "
                    "pdsh; .ci/run installs it)")
def test_hosts_ssh_cannot_reach_are_named_before_any_worker_starts(tmp_path):
    """A real pdsh, on hosts that do not resolve (nothing is sent anywhere): deepy.py refuses the
    launch naming each host as the hostfile does (pdsh labels them up to the first dot), what
    ssh said, and the way out."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-x.invalid slots=1\nnode-y.invalid slots=1\n")
    script = tmp_path / "worker.py"
    script.write_text("raise SystemExit('a worker started')\n")
    proc = deepy(str(script), "configs/tiny.yml", f"hostfile={hostfile}", "num_gpus=1",
                 "master_addr=10.0.0.1", env=clean_env(), timeout=120)
    assert proc.returncode == 1, proc.stderr
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("error: pdsh cannot run a command on node-x.invalid, node-y.invalid "
                            "over ssh ("), error
    assert "ssh exited with exit code 255" in error and "Could not resolve hostname" in error
    assert error.endswith("or set no_ssh_check=true to start without this check")
    assert "a worker started" not in proc.stderr + proc.stdout
