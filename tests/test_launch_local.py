"""deepy.py's own launching, piece by piece: each worker's environment, the one-line death
reports (local workers and those DeepSpeed's runner, mpirun and srun report), the exit status,
secrets hidden from relayed output and carried by the private env file (A34). Real processes
and signals; the runs themselves: tests/e2e/test_worker_failures.py, tests/e2e/test_secrets.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron.launching.local import death_line, local_launch, run_local, worker_env
from megatron.launching.runner import describe_runner_line
from megatron.launching.secrets import Redactor, load_env_file, write_env_file
from megatron.launching.stopping import LAUNCH_ID_VAR, exit_description, tagged

ROOT = Path(__file__).resolve().parent.parent


def test_each_worker_gets_the_variables_deepspeeds_launcher_would_set():
    hosts = {"n0": [0, 1], "n1": [0, 1], "n2": [2, 3]}
    here = local_launch(hosts, 2, "10.0.0.1", 29500)
    env = worker_env({"KEEP": "1", "RANK": "stale"}, here, 1, "abc")
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK",
                                "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_SIZE": "2", "CROSS_RANK": "2",
        "CROSS_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert env["KEEP"] == "1" and env[LAUNCH_ID_VAR] == "abc"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # this node's slots, as DeepSpeed sets them
    assert here.host == "n2"
    assert local_launch({"localhost": [0]}, 0, "127.0.0.1", 1).host == socket.gethostname()
    with pytest.raises(ValueError, match=r"node_rank\(3\) must be in \[0, 3\)"):
        local_launch(hosts, 3, "10.0.0.1", 29500)


def test_death_lines_name_rank_host_and_signal_or_status():
    here = local_launch({"node-a": [0, 1], "node-b": [0, 1]}, 1, "a", 1)
    assert death_line(here, 1, -signal.SIGKILL) == \
        "worker rank 3 (local rank 1) on node-b died: killed by SIGKILL"
    assert death_line(here, [1, 0], 1) == "worker ranks 2-3 (local ranks 0-1) on node-b died: " \
        "exited with status 1"
    assert death_line(here, 0, 1) == "worker rank 2 (local rank 0) on node-b died: exited with " \
                                     "status 1"
    assert exit_description(-200) == "killed by signal 200"  # no name: the number


@pytest.mark.parametrize("line,expected", [
    ("n1: [2026-01-01 00:00:00] [ERROR] [launch.py:325:sigkill_handler] ['python', '-u', "
     "'train.py', '--neox_args', '<config>'] exits with return code = -9",
     "a worker on n1 died: killed by SIGKILL"),
    ("[2026] [ERROR] [launch.py:325:sigkill_handler] [...] exits with return code = 1",
     "a worker died: exited with status 1"),
    ("mpirun noticed that process rank 1 with PID 4242 on node n7 exited on signal 9 (Killed).",
     "worker rank 1 on n7 died: killed by SIGKILL"),
    ("prterun noticed that process rank 1 with PID 0 on node n7 exited on signal 9 (Killed).",
     "worker rank 1 on n7 died: killed by SIGKILL"),
    ("srun: error: n3: task 2: Killed", "worker rank 2 on n3 died: killed by SIGKILL"),
    ("srun: error: n3: tasks 0-1: Exited with exit code 138", ""),  # a stop after saving
    ("srun: error: n3: task 0: Exited with exit code 1",
     "worker rank 0 on n3 died: exited with status 1"),
    ("iteration 10/20 | lm_loss 2.1", None),
])
def test_launcher_reports_of_a_dead_worker_become_one_line(line, expected):
    got = describe_runner_line(line)
    assert (got is None) if expected is None else got.startswith(expected), got


def test_a_report_wrapped_over_two_lines_is_joined(capfd):
    import subprocess

    from megatron.launching.runner import relay

    text = ("prterun noticed that process rank 1 with PID 0 on node vm exited on\n"
            "signal 9 (Killed).\nnext\n")
    proc = subprocess.Popen([sys.executable, "-c", f"print({text!r}, end='')"],
                            stdout=subprocess.PIPE)
    relay(proc.stdout, sys.stdout, Redactor({})).join()
    proc.wait()
    assert capfd.readouterr().out == "worker rank 1 on vm died: killed by SIGKILL\nnext\n"


def relayed(text: str) -> str:
    import io

    from megatron.launching.runner import relay

    out = io.StringIO()
    relay(io.BytesIO(text.encode()), out, Redactor({})).join()
    return out.getvalue()


def test_mpiruns_boxed_report_of_a_stop_after_saving_is_dropped_and_of_a_death_reworded():
    rule = "-" * 74
    stop = (f"{rule}\nprterun detected that one or more processes exited with non-zero status,\n"
            "thus causing the job to be terminated. The first process to do so was:\n\n"
            f"   Process name: [prterun-vm-5431@1,1]\n   Exit code:    138\n{rule}\n")
    assert relayed("before\n" + stop + "after\n") == "before\nafter\n"
    crash = stop.replace("Exit code:    138", "Exit code:    1")
    assert relayed(crash) == crash  # a real failure's box is kept whole
    death = (f"{rule}\nprterun noticed that process rank 1 with PID 0 on node vm exited on\n"
             f"signal 9 (Killed).\n{rule}\n")
    assert relayed(death) == f"{rule}\nworker rank 1 on vm died: killed by SIGKILL\n{rule}\n"


def test_deepspeeds_notes_of_deepys_own_variables_file_are_not_relayed():
    note = "[2026-11-29 19:08:43,376] [INFO] [runner.py:607:main] deepspeed_env file = "
    user = note + "/home/me/.deepspeed_env\n"
    assert relayed(f"{note}/tmp/neox_env_w55w1fkx\n" * 2 + user) == user


def relayed_through_merger(text: str) -> str:
    import io

    from megatron.launching.merge import WarningMerger
    from megatron.launching.runner import relay

    out = io.StringIO()
    merger = WarningMerger(out, range(2))
    relay(io.BytesIO(text.encode()), out, Redactor({}), merger=merger).join()
    merger.close()
    return out.getvalue()


def test_mpirun_and_srun_reports_of_exits_the_workers_explained_are_dropped():
    """Both ranks print the same error of several lines and exit 1: it is printed once with
    both ranks, and mpirun's box (or srun's line) about their exit is not; a rank that said
    nothing keeps its report, after the errors."""
    rule = "-" * 74
    errors = "".join(f"error (rank {r} on vm): no checkpoint in ck can be loaded:\n"
                     "  - ck/global_step2/a.pt: corrupt\nRestore the files from a backup\n"
                     for r in (1, 0))
    merged = ("error (ranks 0-1 on vm): no checkpoint in ck can be loaded:\n"
              "  - ck/global_step2/a.pt: corrupt\nRestore the files from a backup\n")

    def box(process: str) -> str:
        return (f"{rule}\nprterun detected that one or more processes exited with non-zero "
                "status,\nthus causing the job to be terminated. The first process to do so "
                f"was:\n\n   Process name: [{process}]\n   Exit code:    1\n{rule}\n")

    assert relayed_through_merger(errors + box("prterun-vm-5431@1,0")) == merged
    assert relayed_through_merger(errors + box("[37934,1],1")) == merged  # Open MPI 4's name
    assert relayed_through_merger(errors + "srun: error: n3: tasks 0-1: Exited with exit code 1\n"
                                  ) == merged
    only_one = errors.split("error (rank 0")[0]  # rank 1's error; rank 0 ends silently
    assert relayed_through_merger(only_one + box("prterun-vm-5431@1,0")) == (
        only_one + box("prterun-vm-5431@1,0"))
    assert relayed_through_merger(only_one + "srun: error: n3: task 0: Exited with exit code 1\n"
                                  ) == only_one + "worker rank 0 on n3 died: exited with status 1\n"


def test_secrets_and_the_config_are_hidden_in_relayed_output():
    r = Redactor({"HF_TOKEN": "hf_0123456789", "WANDB_MODE": "offline"}, ["ENCODEDBLOB"])
    line = ("pdsh -w a,b export HF_TOKEN=hf_0123456789; export WANDB_MODE=offline; cd /x; "
            "python -u train.py --neox_args ENCODEDBLOB; -genv HF_TOKEN hf_0123456789 "
            "--export=ALL,HF_TOKEN=\"a b\" token hf_0123456789; offline mode")
    assert r.clean(line) == (
        "pdsh -w a,b export HF_TOKEN=<hidden>; export WANDB_MODE=<hidden>; cd /x; "
        "python -u train.py --neox_args <config>; -genv HF_TOKEN <hidden> "
        "--export=ALL,HF_TOKEN=<hidden> token <hidden>; offline mode")


def test_an_exported_path_is_hidden_where_assigned_only():
    """HF_HOME=/scratch/me/hf: the paths a run prints under it stay readable; a token in the same
    export, and a value that starts like a path but holds spaces, are hidden everywhere."""
    r = Redactor({"HF_HOME": "/scratch/me/hf", "HF_TOKEN": "hf_0123456789",
                  "ODD": "/not a path but a phrase"})
    line = ("export HF_HOME=/scratch/me/hf; loading /scratch/me/hf/hub/model with hf_0123456789 "
            "said /not a path but a phrase")
    assert r.clean(line) == ("export HF_HOME=<hidden>; loading /scratch/me/hf/hub/model with "
                             "<hidden> said <hidden>")


def test_the_env_file_is_private_and_sets_the_workers_variables(tmp_path):
    path = write_env_file({"HF_TOKEN": "x=y;z", "WANDB_API_KEY": "k"}, str(tmp_path / "sub"))
    assert os.stat(path).st_mode & 0o077 == 0 and os.stat(tmp_path / "sub").st_mode & 0o077 == 0
    assert json.loads(open(path).read()) == {"HF_TOKEN": "x=y;z", "WANDB_API_KEY": "k"}
    environ = {"NEOX_ENV_FILE": path, "HF_TOKEN": "old"}
    assert load_env_file(environ) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert environ["HF_TOKEN"] == "x=y;z" and os.path.exists(path)  # other nodes may read it
    assert load_env_file({}) == []
    with pytest.raises(RuntimeError, match=f"NEOX_ENV_FILE={tmp_path}/gone cannot be read on "
                                           f"{socket.gethostname()} .*set env_file_dir"):
        load_env_file({"NEOX_ENV_FILE": str(tmp_path / "gone")})


def test_a_failed_worker_is_reported_and_the_other_is_stopped(capfd, monkeypatch):
    """Two real processes: local rank 1 exits 3 at once, local rank 0 would sleep for a
    minute; it is stopped, the status is the failed worker's and nothing tagged is left."""
    monkeypatch.setattr("megatron.launching.local.FAILURE_GRACE_SECONDS", 5.0)
    here = local_launch({"localhost": [0, 1]}, 0, "127.0.0.1", 1)
    script = "import os, sys, time\nif os.environ['LOCAL_RANK'] == '1': sys.exit(3)\ntime.sleep(60)"
    status = run_local([sys.executable, "-c", script], dict(os.environ), here, 600, "t-launch-1")
    err = capfd.readouterr().err
    assert status == 3
    assert [line for line in err.splitlines() if " died: " in line] == [
        f"worker rank 1 (local rank 1) on {socket.gethostname()} died: exited with status 3"]
    assert "stopping the other 1 worker(s)" in err and tagged("t-launch-1") == []


def two_workers(script: str, launch_id: str, capfd) -> list[str]:
    """Launch `script` as two local workers; deepy.py's lines on stderr (the run ends 1)."""
    here = local_launch({"localhost": [0, 1]}, 0, "127.0.0.1", 1)
    status = run_local([sys.executable, "-c", script], dict(os.environ), here, 600, launch_id)
    err = capfd.readouterr().err
    assert status == 1, err
    return err.splitlines()


def test_workers_failing_alike_print_their_error_once_and_no_death_line(capfd):
    """An error every rank meets (a config value the workers refuse) ends each worker with the
    same line: deepy.py prints it once with the ranks, and that line is the whole report (no
    death line says again that they exited)."""
    script = ("import os, sys, time\nif os.environ['LOCAL_RANK'] == '1': time.sleep(0.3)\n"
              "print(f'error (rank {os.environ[\"RANK\"]} on vm): no such task', file=sys.stderr)\n"
              "sys.exit(1)")
    assert two_workers(script, "t-launch-3", capfd) == ["error (ranks 0-1 on vm): no such task"]


def test_a_worker_killed_just_after_anothers_explained_error_is_reported(capfd):
    """Rank 0 says why and exits 1; rank 1 says nothing and is killed by SIGKILL 0.3 s later
    (within the wait for workers failing alike): its death is not left out with rank 0's."""
    script = ("import os, signal, sys, time\nif os.environ['LOCAL_RANK'] == '1':\n"
              "    time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)\n"
              "print('error (rank 0 on vm): checkpoint damaged', file=sys.stderr)\nsys.exit(1)")
    assert two_workers(script, "t-launch-4", capfd) == [
        "error (rank 0 on vm): checkpoint damaged",
        f"worker rank 1 (local rank 1) on {socket.gethostname()} died: killed by SIGKILL"]


def test_workers_that_stop_on_their_own_signal_are_not_deaths(capfd):
    here = local_launch({"localhost": [0, 1]}, 0, "127.0.0.1", 1)
    status = run_local([sys.executable, "-c", "import sys; sys.exit(143)"], dict(os.environ),
                       here, 600, "t-launch-2")
    assert status == 143 and " died: " not in capfd.readouterr().err


def test_a_stop_signal_that_comes_as_the_workers_end_loses_none_of_their_output():
    """A pdsh launch's stop reaches a node launcher over ssh, so it can come after the node's
    workers already stopped (their ranks agreed on another node's signal), while their last
    lines are being read. The launcher still relays those lines and returns the workers'
    status; it used to be ended by the signal there, and the worker's `preempted ...` line was
    lost. The worker's child keeps the pipe open for a second to stretch that moment."""
    worker = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.5); "
              "print(\"preempted (SIGTERM) at iteration 9\", flush=True)'])\n"
              "print('saved checkpoint', flush=True)\n"
              "sys.exit(143)\n")
    launcher = ("import os, signal, sys\n"
                "from megatron.launching.local import local_launch, run_local\n"
                "here = local_launch({'localhost': [0]}, 0, '127.0.0.1', 1)\n"
                f"status = run_local([sys.executable, '-c', {worker!r}], dict(os.environ), "
                "here, 600, 't-launch-5', abort_signal=signal.SIGUSR1)\n"
                "print(f'node launcher ends: {status}', flush=True)\n"
                "sys.exit(status)\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = [proc.stdout.readline()]
    assert lines == ["saved checkpoint\n"], lines
    time.sleep(0.7)  # the worker has ended; its child still holds the pipe
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, out)
    assert out.splitlines() == ["preempted (SIGTERM) at iteration 9",
                                "node launcher ends: 143"], out
    assert tagged("t-launch-5") == []
