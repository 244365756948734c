"""A two-node tiny run over pdsh (`launcher: pdsh`, "nodes" localhost and 127.0.0.1 reached through
an sshd of the test's own) as users stop it or lose it (A34): SIGTERM to deepy.py reaches every
node's workers, which save and exit within `signal_grace_seconds` (not a launcher's fixed
limit); a worker killed on one node is named with its rank and node, and the other node's
workers are stopped; an error every rank meets is printed once, with no line for the deaths it
explains. Nothing of the launch is left on any node afterwards."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from megatron.launching.stopping import LAUNCH_ID_VAR
from tests.e2e import local_sshd
from tests.e2e.test_cluster_launchers import pdsh_missing
from tests.e2e.test_worker_failures import (assert_latest_checkpoint_intact, damaged_resume,
                                            stop_with)
from tests.runs import ROOT, clean_env, deepy, explain, tiny_overrides, wait_for_text

pytestmark = pytest.mark.slow
HOSTS = "localhost slots=1\n127.0.0.1 slots=1\n"


@pytest.fixture
def sshd(tmp_path):
    reason = pdsh_missing()
    if reason:
        pytest.skip(reason)
    with local_sshd.local_sshd(tmp_path / "sshd") as env:
        yield env


def start(small_data, run: Path, ssh_env: dict, **extra) -> tuple[subprocess.Popen, Path]:
    """deepy.py over pdsh on a long tiny run (checkpoints every 4 steps); its output's file."""
    hostfile = run.parent / "hostfile"
    hostfile.write_text(HOSTS)
    log = run.parent / f"{run.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
             *tiny_overrides(*small_data, run, train_iters=2000, checkpoint_factor=4,
                             eval_interval=1000, log_interval=1, hostfile=hostfile,
                             launcher="pdsh", num_gpus=1, master_addr="127.0.0.1",
                             omp_num_threads=1, env_file_dir=run.parent / "shared", **extra)],
            cwd=ROOT, env=clean_env(**ssh_env), stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def launch_processes() -> dict[str, list[psutil.Process]]:
    """{"launchers": node launchers, "workers": training workers} of the pdsh launch running on
    this machine, found by their launch tag (they are sshd's children, not deepy.py's)."""
    found = {"launchers": [], "workers": []}
    for proc in psutil.process_iter():
        try:
            tag, argv = proc.environ().get(LAUNCH_ID_VAR), proc.cmdline()
        except psutil.Error:
            continue
        if tag and "megatron.launching.node" in argv:
            found["launchers"].append(proc)
        elif tag and "-node" in tag and "train.py" in argv:
            parent = proc.parent()  # a data loader's parent is a worker, tagged like it
            if parent is None or "-node" not in parent.environ().get(LAUNCH_ID_VAR, ""):
                found["workers"].append(proc)
    return found


def worker_of_rank(rank: int) -> psutil.Process:
    return next(p for p in launch_processes()["workers"] if p.environ()["RANK"] == str(rank))


def assert_nothing_left(pids: list[int]) -> None:
    alive = [p for p in pids if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive and not any(launch_processes().values())


def test_sigterm_reaches_every_node_which_saves_and_exits(small_data, tmp_path, sshd):
    run = tmp_path / "run"
    proc, log = start(small_data, run, sshd)
    pids = []

    def note_processes():
        found = launch_processes()
        pids.extend(p.pid for group in found.values() for p in group)
        assert len(found["launchers"]) == 2 and len(found["workers"]) == 2

    out = stop_with(proc, log, signal.SIGTERM, 143, before=note_processes)
    latest = assert_latest_checkpoint_intact(run / "ckpt")
    assert latest >= 3
    assert f"preempted (SIGTERM) at iteration {latest}; checkpoint {run / 'ckpt'}/global_step" \
           f"{latest}" in out, out[-3000:]
    assert " died: " not in out and "did not exit" not in out and "--neox_args" not in out
    assert_nothing_left(pids)


def test_a_worker_killed_on_one_node_is_named_and_the_other_node_stopped(small_data, tmp_path,
                                                                          sshd):
    run = tmp_path / "run"
    proc, log = start(small_data, run, sshd)
    try:
        wait_for_text(log, "iteration      6/", proc)  # past the checkpoint of step 4
        found = launch_processes()
        pids = [p.pid for group in found.values() for p in group]
        worker_of_rank(1).send_signal(signal.SIGKILL)
        status = proc.wait(timeout=300)
    finally:
        proc.kill()
    out = log.read_text()
    assert status == 137, out[-3000:]  # the dead worker's status, as a shell says it
    died = [line for line in out.splitlines() if " died: " in line]
    # the first death is the cause: rank 0 may die of the lost connection before the node
    # launchers' stop reaches it, and says so
    assert died[0] == ("127.0.0.1: worker rank 1 (local rank 0) on 127.0.0.1 died: killed by "
                       "SIGKILL"), out[-3000:]
    assert died[1:] == [], out[-3000:]  # rank 0's own error says why, if it failed
    assert "GLHF" not in out  # gloo's message for the lost peer, said in one short line
    assert ("localhost: a worker on another node failed: stopping the 1 worker(s) on "
            "localhost" in out or "lost the connection to another rank" in out), out[-3000:]
    assert "node 127.0.0.1 ended with exit status 137" in out and "ssh failed" not in out
    assert assert_latest_checkpoint_intact(run / "ckpt") >= 4
    assert_nothing_left(pids)


def test_an_error_every_node_explains_is_printed_once_with_no_death_line(trained, tmp_path,
                                                                          sshd):
    """Every worker on both nodes refuses the damaged checkpoint with its error line and exits 1:
    the error is printed (once for both ranks when the nodes meet it within the merge window),
    and neither the node launchers' death lines nor pdsh's reports of the nodes' exits are;
    deepy.py exits 1, the status of the first death."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(HOSTS)
    argv, save = damaged_resume(trained, tmp_path, hostfile=hostfile, launcher="pdsh",
                                num_gpus=1, master_addr="127.0.0.1", omp_num_threads=1,
                                env_file_dir=tmp_path / "shared")
    proc = deepy(*argv, env=clean_env(**sshd))
    assert proc.returncode == 1, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if "error (" in line]
    ranks = [re.search(r"error \((ranks? [\d\-]+) on ", line)[1] for line in errors]
    assert sorted(ranks) in (["ranks 0-1"], ["rank 0", "rank 1"]), explain(proc)
    assert all(e.endswith(f"): no checkpoint in {save} can be loaded:") for e in errors), \
        explain(proc)
    assert " died: " not in proc.stderr and "ended with exit status" not in proc.stderr, \
        explain(proc)
    assert not any(launch_processes().values())


def test_the_grace_time_is_signal_grace_seconds_on_every_node(small_data, tmp_path, sshd):
    """A worker that cannot stop (SIGSTOP) is killed signal_grace_seconds after the SIGTERM, on
    its node, by its node's launcher: not after some launcher's fixed limit."""
    run = tmp_path / "run"
    proc, log = start(small_data, run, sshd, signal_grace_seconds=3)
    try:
        wait_for_text(log, "iteration      3/", proc)
        found = launch_processes()
        pids = [p.pid for group in found.values() for p in group]
        worker_of_rank(1).send_signal(signal.SIGSTOP)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 143, log.read_text()[-3000:]
        took = time.monotonic() - sent
    finally:
        proc.kill()
    out = log.read_text()
    assert "127.0.0.1: deepy.py: worker rank(s) 1 did not exit within signal_grace_seconds: " \
           "killing them (SIGKILL)" in out, out[-3000:]
    assert took < 20, f"{took:.1f} s from SIGTERM to exit with signal_grace_seconds=3"
    assert_nothing_left(pids)
