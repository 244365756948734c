"""The hang watchdog on real processes and signals (megatron/safety/watchdog.py, heartbeat.py):
a phase past its limit ends the process with code 124 after printing what it was doing, its
stack, and the peer that stopped progressing; limits follow the config; a run that keeps its
limits is left alone and leaves heartbeats that say where it was."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from megatron.monitoring.logger import who
from megatron.safety import watchdog
from megatron.safety.watchdog import EXIT_CODE, Limits, Watchdog
from tests.runs import ROOT

# generous bound for a process that must end on its own; the limits under test are ~1 s
ENDS_WITHIN = 60


def training(minutes=10.0, factor=20.0, checkpoint=60.0):
    return SimpleNamespace(hang_timeout_minutes=minutes, hang_step_factor=factor,
                           hang_timeout_checkpoint_minutes=checkpoint)


def test_limits_follow_the_config():
    limits = Limits.from_training(training())
    assert limits.of("train step", None) == 3600  # first step: warm-up may take the long limit
    assert limits.of("train step", 2.0) == 600  # 20 x 2 s is under the 10-minute floor
    assert limits.of("eval step", 60.0) == 1200  # 20 x the median train step
    assert limits.of("stop check", 60.0) == 1200  # the all-reduce after each step, alike
    assert limits.of("checkpoint save", 60.0) == limits.of("checkpoint load", None) == 3600
    no_checkpoint = Limits.from_training(training(checkpoint=0))
    assert no_checkpoint.of("checkpoint save", 1.0) is None
    assert no_checkpoint.of("train step", None) == 600
    assert Limits.from_training(training(minutes=0)) is None
    assert Limits.from_training(training(minutes=None)) is None
    with pytest.raises(ValueError, match="no phase 'backward'; watched phases: train step"):
        limits.of("backward", 1.0)


def test_rank_lists_read_as_ranges():
    assert who([3]) == "rank 3"
    assert who([9, 0, 2, 3, 4, 5]) == "ranks 0, 2-5, 9"


def worker(rank: int, world: int, log_dir, limit: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "tests.safety.hang_worker", str(rank),
                             str(world), str(log_dir), str(limit)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_beat(heartbeats, rank: int, proc: subprocess.Popen, iteration: int,
                  within: float = ENDS_WITHIN) -> dict:
    """Rank `rank`'s heartbeat once it is in a train step at `iteration` or later; `proc` is
    the process tree that must still be running."""
    path = heartbeats / f"rank{rank:05d}.json"
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            beat = json.loads(path.read_text())
            if beat["phase"] == "train step" and beat["iteration"] >= iteration:
                return beat
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no heartbeat of rank {rank} at iteration {iteration} in {path}: "
                         f"{proc.communicate(timeout=60) if proc.poll() is not None else ''}")


def test_a_step_past_its_limit_ends_the_rank_and_names_the_stopped_peer(tmp_path):
    """Rank 1 is stopped (SIGSTOP) in its third step; rank 0, waiting there, reports after its
    1 s limit: its own state and stack, and rank 1 as the rank whose heartbeat stopped."""
    stopped = worker(1, 2, tmp_path, 6.0)  # stopped long before its own limit
    try:
        beat = wait_for_beat(tmp_path / "heartbeats", 1, stopped, 3)
        os.kill(stopped.pid, signal.SIGSTOP)
        waiting = worker(0, 2, tmp_path, 1.0)
        out, err = waiting.communicate(timeout=ENDS_WITHIN)
    finally:
        os.kill(stopped.pid, signal.SIGKILL)
        stopped.wait()
    assert waiting.returncode == EXIT_CODE, err
    host = beat["host"]
    assert (f"hang watchdog: rank 0 (host {host}, pid {waiting.pid}): iteration 3, phase train "
            "step has run ") in err
    assert "(limit 1.0 s), at threading.py:" in err  # where it waits
    assert re.search(r"\(wait\), from tests/safety/hang_worker.py:\d+ \(wait_for_peer\)", err)
    assert re.search(r'File ".*hang_worker.py", line \d+ in wait_for_peer', err)  # the stack
    assert (f"rank 1 (host {host}, pid {stopped.pid}) is not progressing: its heartbeat "
            "stopped at iteration 3, train step") in err, err
    assert f"rank 0 exits with code {EXIT_CODE}" in err


def test_a_timed_out_collective_names_where_the_other_ranks_were(tmp_path):
    """Rank 0's all-reduce times out (3 s) while rank 1 waits outside any collective, as a rank
    whose data loader stalled. Rank 0 says where it waited and where rank 1's last heartbeat put
    it, then ends as train.py does: the error in one line, exit status 1."""
    from tests.runs import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "tests.safety.timeout_worker"]
    common = ["2", str(tmp_path), str(free_port()), "3"]
    procs = [subprocess.Popen([*argv, str(rank), *common], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    try:
        _, err = procs[0].communicate(timeout=ENDS_WITHIN)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode == 1, err
    host = json.loads((tmp_path / "heartbeats" / "rank00001.json").read_text())["host"]
    lines = err.splitlines()
    assert lines[0].startswith(
        f"collective timeout: rank 0 (host {host}, pid {procs[0].pid}) waited 3 s "
        "(distributed_timeout_minutes) at iteration 2, phase eval step, in "
        "torch.distributed.all_reduce, called at tests/safety/timeout_worker.py:"), err
    assert lines[0].endswith("(main); the other ranks' last heartbeats:"), err
    assert re.fullmatch(r"collective timeout: rank 1: iteration 2, eval step for \d+\.\d s, at "
                        r"threading\.py:\d+ \(wait\), from tests/safety/timeout_worker\.py:\d+ "
                        r"\(stuck_in_loader\); written \d+\.\d s ago", lines[1]), err
    assert lines[2] == (
        f"error (rank 0 on {host}): a collective timed out: this rank waited 3 s "
        "(distributed_timeout_minutes) for another rank that never joined it; the 'collective "
        "timeout:' lines above say where each rank was (they need log_dir and the hang "
        "watchdog). If a rank can legitimately take that long (a slow save or data load), raise "
        "distributed_timeout_minutes"), err
    assert len(lines) == 3, err  # no traceback, no gloo message


def test_a_run_within_its_limits_is_left_alone_and_its_heartbeat_says_where_it_was(tmp_path):
    dog = Watchdog(Limits(step=30.0, step_factor=0.0, checkpoint=None), rank=2, world_size=4,
                   heartbeat_dir=tmp_path)
    dog.start()
    try:
        with dog.phase("train step", 1):
            time.sleep(0.05)
        with dog.phase("checkpoint save", 1):  # not watched: no checkpoint limit
            pass
        between = json.loads((tmp_path / "rank00002.json").read_text())
    finally:
        dog.stop()
    assert between["rank"] == 2 and between["pid"] == os.getpid()
    assert between["phase"] in ("start-up", "after train step", "after checkpoint save")
    last = json.loads((tmp_path / "rank00002.json").read_text())
    assert (last["phase"], last["iteration"]) == ("run ended", 1)
    assert last["beat"] > between["beat"]


def test_phases_do_nothing_without_a_running_watchdog():
    with watchdog.phase("train step", 1):
        pass
    args = SimpleNamespace(training=training(minutes=0), logging=SimpleNamespace(log_dir=None))
    with watchdog.running(args, 0, 1) as dog:
        assert dog is None
        with watchdog.phase("no such phase"):  # nothing checks it
            pass


def _forks(*argv: str) -> tuple[int, int]:
    raw = "raw" in argv
    try:
        out = subprocess.run([sys.executable, "-m", "tests.safety.fork_worker", *argv], cwd=ROOT,
                             capture_output=True, text=True, timeout=30 if raw else 600)
    except subprocess.TimeoutExpired:
        if not raw:
            raise
        return 1, 0  # unguarded, the deadlock took the forking process itself: stuck as well
    assert out.returncode == 0, out.stderr
    stuck, done = re.search(r"stuck children: (\d+) of (\d+)", out.stdout).groups()
    return int(stuck), int(done)


def test_forks_beside_the_heartbeats_frame_reads_never_deadlock():
    """The heartbeat reads the main thread's frame while DataLoaders fork their workers; a read
    during a fork used to leave a DataLoader worker stuck for ever (the rank then hung in its
    next eval)."""
    if sys.version_info < (3, 12):  # the interpreter bug the guard is for: seen without it
        stuck, done = _forks("600", "raw")
        assert stuck == 1, f"no fork deadlocked in {done} without the guard: the test cannot tell"
    assert _forks("300") == (0, 300)


def test_last_heartbeats_group_the_ranks_alike_and_name_missing_and_ended_ones(tmp_path):
    from megatron.safety.heartbeat import last_beats, write_beat

    def beat(rank, phase, where, host="a", iteration=7, seconds=1.0):
        write_beat(tmp_path, {"rank": rank, "host": host, "pid": 100 + rank, "phase": phase,
                              "iteration": iteration, "seconds": seconds, "where": where,
                              "beat": 1})

    waiting = "in torch.distributed.all_reduce, called at megatron/training/step.py:9 (step)"
    beat(0, "train step", waiting)  # the reporting rank: left out
    beat(1, "train step", waiting, host="b", seconds=5.0)
    beat(2, "train step", waiting, host="b", seconds=6.5)
    beat(3, "train step", "at dataloader.py:5 (_next_data)", seconds=0.5)
    beat(5, "run ended", "not running Python code")
    lines = last_beats(tmp_path, 7, own_rank=0, own_host="a")
    assert lines[0] == f"ranks 1-2: iteration 7, train step for up to 6.5 s, {waiting}"
    assert re.fullmatch(r"rank 3: iteration 7, train step for 0\.5 s, at dataloader\.py:5 "
                        r"\(_next_data\); written \d+\.\d s ago", lines[1])
    assert lines[2] == (f"no heartbeat in {tmp_path} from ranks 4, 6 (not started, or on a node "
                        "that does not share log_dir)")
    assert lines[3] == "run ended (finished or failed): rank 5"
    assert len(lines) == 4
