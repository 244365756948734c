"""One run per save directory (megatron/safety/lock.py): a live holder is named and refused, a
stale lock is taken over with a warning, and two real runs on one directory do not both train."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from megatron.safety.lock import LOCK_NAME, SaveDirInUse, acquire, check_free, save_dir_lock
from tests.logs import Warnings
from tests.runs import ROOT, deepy, explain, tiny_overrides


def write_lock(root, **holder):
    root.mkdir(parents=True, exist_ok=True)
    (root / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "started": 0,
                                              "command": "train.py other.yml", **holder}))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_lock_names_its_holder_and_is_released(tmp_path):
    with save_dir_lock(tmp_path / "save") as path:
        holder = json.loads(path.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(SaveDirInUse, match=rf"in use by another run: pid {os.getpid()} on "
                                               rf"host {socket.gethostname()} since"):
            acquire(tmp_path / "save")
    assert not (tmp_path / "save" / LOCK_NAME).exists()
    check_free(tmp_path / "save")  # nothing holds it now


@pytest.mark.parametrize("kind", ["dead pid", "reused pid"])
def test_a_stale_lock_is_taken_over_with_a_warning(kind, tmp_path):
    if kind == "dead pid":
        write_lock(tmp_path, pid=dead_pid())
    else:  # our PID, but the recorded process started at another time: not us
        write_lock(tmp_path, pid=os.getpid(), process_start=1.0)
    handler = Warnings()
    logging.getLogger("megatron").addHandler(handler)
    try:
        path = acquire(tmp_path)
    finally:
        logging.getLogger("megatron").removeHandler(handler)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert any("taking over the lock of" in m and "its holder is gone" in m
               for m in handler.messages)


def test_a_lock_from_another_host_is_refused_saying_how_to_remove_it(tmp_path):
    write_lock(tmp_path, host="node-17", pid=4242)
    with pytest.raises(SaveDirInUse, match="pid 4242 on host node-17.*another host.*delete the "
                                           "lock file"):
        check_free(tmp_path)


def test_a_second_run_on_the_same_save_directory_is_refused_naming_the_first(small_data,
                                                                            tmp_path):
    run = tmp_path / "run"
    output = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
         *tiny_overrides(*small_data, run, num_gpus=1, train_iters=30, checkpoint_factor=30,
                         eval_interval=1000)],
        cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not (run / "ckpt" / LOCK_NAME).exists() and first.poll() is None:
            assert time.time() < deadline, "the first run never took the lock"
            time.sleep(0.2)
        holder = json.loads((run / "ckpt" / LOCK_NAME).read_text())
        second = deepy("train.py", "configs/tiny.yml",
                       *tiny_overrides(*small_data, tmp_path / "other", num_gpus=1,
                                       save=run / "ckpt", load=run / "ckpt"))
        assert second.returncode == 1, explain(second)
        assert (f"save directory {run / 'ckpt'} is in use by another run: pid {holder['pid']} "
                f"on host {socket.gethostname()}") in second.stderr, explain(second)
        assert "training" not in second.stdout  # refused before any worker started
        assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-4000:]
    finally:
        first.kill()
        output.close()
    assert not (run / "ckpt" / LOCK_NAME).exists()  # released at the end of the run
    assert (run / "ckpt" / "latest").read_text() == "global_step30"
