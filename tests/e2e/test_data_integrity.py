"""Token files changed around a real training run (A16, A17): `touch` is harmless, a same-size
edit is caught at the next save or resume, a `.bin` truncated under the run is named.

Every run is one real worker with loader worker processes, started by deepy.py (the runs
changed under them) or forked in-process as deepy.py would start it (tests/runs.py); the files
are real and are changed from this process while the run reads them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from megatron.checkpointing.layout import read_latest
from megatron.checkpointing.manifest import check_files, read_manifest
from megatron.data.content_hash import sample_ranges
from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from tests.runs import ROOT, clean_env, deepy, explain, launch_in_process, tiny_overrides

# one process, a one-layer model: iterations take milliseconds, start-up dominates
FAST = dict(num_gpus=1, num_layers=1, hidden_size=32, seq_length=32, train_batch_size=4,
            train_micro_batch_size_per_gpu=4, eval_interval=1000, eval_iters=1, log_interval=1,
            checkpoint_factor=5)


def copy_data(small_data, into: Path) -> tuple[str, str]:
    """A private copy of the session's token files (tests change them): (prefix, tokenizer)."""
    prefix, tokenizer = small_data
    into.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, into / (Path(prefix).name + ext))
    return str(into / Path(prefix).name), tokenizer


def change_tokens(prefix: str, byte_offset: int, count: int = 16) -> None:
    """Replace `count` uint16 tokens from about `byte_offset` by other valid ids; the size
    stays."""
    byte_offset -= byte_offset % 2
    with open(prefix + ".bin", "r+b") as f:
        f.seek(byte_offset)
        tokens = np.frombuffer(f.read(2 * count), dtype=np.uint16)
        f.seek(byte_offset)
        f.write(((tokens.astype(np.int64) + 1) % 1000).astype(np.uint16).tobytes())


def overrides(prefix: str, tokenizer: str, run: Path, **extra) -> list[str]:
    return tiny_overrides(prefix, tokenizer, run, **{**FAST, **extra})


class Training:
    """deepy.py train.py in the background, its output in files, waited on with a bound."""

    def __init__(self, run: Path, argv: list[str]):
        run.mkdir(parents=True, exist_ok=True)
        self.ckpt = run / "ckpt"
        self._out, self._err = open(run / "stdout", "w+"), open(run / "stderr", "w+")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "deepy.py"), "train.py",
                                      "configs/tiny.yml", *argv], cwd=ROOT, env=clean_env(),
                                     stdout=self._out, stderr=self._err, text=True,
                                     start_new_session=True)

    def wait_for_checkpoint(self, step: int, limit: float = 240) -> None:
        deadline = time.monotonic() + limit
        while not (self.ckpt / f"global_step{step}").is_dir():
            assert self.proc.poll() is None, f"exited before checkpoint {step}: {self.finish()}"
            assert time.monotonic() < deadline, f"no checkpoint {step} in {limit} s"
            time.sleep(0.02)

    def stop(self) -> None:
        """End the launcher and the workers it started (its own process group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def checkpoints(self) -> set[str]:
        return {p.name for p in self.ckpt.glob("global_step*")}

    def finish(self, limit: float = 240) -> subprocess.CompletedProcess:
        """Its exit status and output; a run still going after `limit` s fails the test."""
        try:
            self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the run was still going {limit} s later")
        for f in (self._out, self._err):
            f.seek(0)
        out, err = self._out.read(), self._err.read()
        for f in (self._out, self._err):
            f.close()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


@pytest.fixture
def past_first_save(small_data, tmp_path):
    """past_first_save(train_iters) -> (prefix, tokenizer, Training): a run on a private copy of
    the data in tmp_path, once its checkpoint 5 is on disk; stopped at the end if still going."""
    started = []

    def start(train_iters: int) -> tuple[str, str, Training]:
        prefix, tok = copy_data(small_data, tmp_path / "data")
        run = tmp_path / "run"
        started.append(Training(run, overrides(prefix, tok, run, train_iters=train_iters)))
        started[-1].wait_for_checkpoint(5)
        return prefix, tok, started[-1]

    yield start
    for training in started:
        training.stop()


def assert_latest_is_intact(ckpt: Path) -> None:
    """`latest` names a checkpoint whose every file has its recorded size and sha256."""
    tag = read_latest(ckpt)
    assert tag is not None
    manifest = read_manifest(ckpt / tag)
    assert check_files(ckpt / tag, manifest, hash_names=manifest.files) == []


def test_touching_the_data_mid_run_and_between_runs_changes_nothing(past_first_save,
                                                                    tmp_path):
    prefix, tok, training = past_first_save(15)
    for ext in (".bin", ".idx"):
        os.utime(prefix + ext)  # new mtime, same content
    saved_before_touch = training.checkpoints()
    proc = training.finish()
    assert proc.returncode == 0, explain(proc)
    assert training.checkpoints() - saved_before_touch  # saves after the touch went through
    os.utime(prefix + ".bin", (1, 1))
    resumed = launch_in_process("train.py", "configs/tiny.yml",
                                *overrides(prefix, tok, tmp_path / "run", train_iters=17,
                                           override_lr_scheduler="true"))
    assert resumed.returncode == 0, explain(resumed)
    assert "from iteration 15 to 17" in resumed.stdout


def test_a_bin_truncated_under_the_run_is_named_and_the_last_checkpoint_is_intact(
        past_first_save):
    prefix, _, training = past_first_save(2000)
    size = os.path.getsize(prefix + ".bin")
    os.truncate(prefix + ".bin", 1000)
    proc = training.finish()
    assert proc.returncode != 0
    assert (f"{prefix}.bin shrank while training read it: expected {size} bytes (as when it was "
            "opened), found 1000 bytes") in proc.stderr, explain(proc)
    assert "Bus error" not in proc.stderr + proc.stdout
    assert "shared memory" not in proc.stderr + proc.stdout
    assert_latest_is_intact(training.ckpt)


def test_data_changed_under_the_run_stops_it_at_the_next_save(past_first_save):
    prefix, _, training = past_first_save(2000)
    change_tokens(prefix, 4096)
    proc = training.finish()
    assert proc.returncode != 0
    assert (f"token files changed on disk while training read them: {prefix}: "
            "bin_sampled_sha256 was ") in proc.stderr, explain(proc)
    assert "so no checkpoint is saved" in proc.stderr
    assert_latest_is_intact(training.ckpt)


@pytest.fixture(scope="module")
def trained_in_full_mode(small_data, tmp_path_factory):
    """A 5 MB .bin (the 64 sampled blocks leave gaps) trained 5 iterations with
    data_fingerprint=full: (prefix, tokenizer, checkpoint directory)."""
    root = tmp_path_factory.mktemp("full")
    prefix = str(root / "data" / "random")
    (root / "data").mkdir()
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    tokens = np.random.default_rng(0).integers(2, 1000, size=2_600_000)
    builder.add_documents(tokens, [1000] * 2600)
    builder.finalize(prefix + ".idx")
    tok = small_data[1]
    proc = launch_in_process("train.py", "configs/tiny.yml",
                             *overrides(prefix, tok, root / "run", train_iters=5,
                                        data_fingerprint="full"))
    assert proc.returncode == 0, explain(proc)
    return prefix, tok, root / "run" / "ckpt"


def resume(trained, tmp_path, change_at: int, mode: str) -> subprocess.CompletedProcess:
    """Resume the checkpoint on a copy of its data with tokens changed at byte `change_at`."""
    prefix, tok, ckpt = trained
    copy = tmp_path / "data" / "random"
    (tmp_path / "data").mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, f"{copy}{ext}")
    change_tokens(str(copy), change_at)
    args = overrides(str(copy), tok, tmp_path / "run", train_iters=5, data_fingerprint=mode,
                     load=ckpt)
    return deepy("train.py", "configs/tiny.yml", *args, env=clean_env())


def test_resume_on_a_same_size_edit_inside_a_sampled_block_is_refused(trained_in_full_mode,
                                                                      tmp_path):
    prefix = trained_in_full_mode[0]
    offset, length = sample_ranges(os.path.getsize(prefix + ".bin"))[20]
    refused = resume(trained_in_full_mode, tmp_path, offset + length // 2, "sampled")
    assert refused.returncode != 0
    assert "the training data differs from the data checkpoint" in refused.stderr, explain(refused)
    assert f"{prefix} (now {tmp_path}/data/random): bin_sampled_sha256 was " in refused.stderr
    assert "allow_data_change: true" in refused.stderr


def test_an_edit_between_sampled_blocks_is_caught_by_the_full_hash_only(trained_in_full_mode,
                                                                        tmp_path):
    prefix = trained_in_full_mode[0]
    (first, length), (second, _) = sample_ranges(os.path.getsize(prefix + ".bin"))[:2]
    gap = first + length + 4096
    assert gap + 32 < second
    refused = resume(trained_in_full_mode, tmp_path, gap, "full")
    assert refused.returncode != 0
    assert f"(now {tmp_path}/data/random): bin_sha256 was " in refused.stderr, explain(refused)
    assert "bin_sampled_sha256" not in refused.stderr  # sampled mode would not see it
