"""Real runs (`python deepy.py train.py configs/tiny.yml`, two gloo processes, data parallel,
dropout on; the workers forked in-process unless one is to fail, tests/runs.py): stopping and resuming changes nothing, and a save that dies, fills the disk or
leaves damaged files loses nothing.

Every run trains the same 6 iterations (checkpoints at 2, 4, 6) as an uninterrupted reference
run; the resumed loss trace (log_interval=1) and the final checkpoint's tensors (weights and
optimizer state) must equal the reference bit for bit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.runs import deepy, explain, launch_in_process, read_metrics, tiny_overrides

STEPS = 6
EXACT_HINT = ("the resumed run diverged from the uninterrupted one; if only dropout differs, "
              "check that nothing draws from torch's global generator between load_checkpoint "
              "and the first step (a DataLoader without its own `generator` does)")


def run(small_data, run_dir: Path, env: dict | None = None, **extra):
    """The tiny config's run of STEPS iterations. With `env` (a fault to inject) deepy.py
    launches it, since a worker dies or fails alone; otherwise its workers are forked
    in-process (tests/runs.py)."""
    prefix, tok = small_data
    values = dict(train_iters=STEPS, checkpoint_factor=2, log_interval=1, hidden_dropout=0.1,
                  eval_interval=4, eval_iters=1)
    values.update(extra)
    argv = ["configs/tiny.yml", *tiny_overrides(prefix, tok, run_dir, **values)]
    if env:
        return deepy("train.py", *argv, env=env)
    return launch_in_process("train.py", *argv)


def losses_by_iteration(run_dir: Path) -> dict[int, float]:
    """The last logged loss of each iteration (re-run iterations override earlier lines)."""
    train, _ = read_metrics(run_dir / "logs")
    return {r["iteration"]: r["lm_loss"] for r in train}


def tensors(obj, prefix="") -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(
        obj, (list, tuple)) else ()
    out = {}
    for key, value in items:
        out.update(tensors(value, f"{prefix}/{key}"))
    return out


def assert_same_state(step_dir: Path, reference_dir: Path) -> None:
    """Every tensor of every DeepSpeed file (weights, optimizer state) is bitwise equal."""
    names = sorted(p.name for p in reference_dir.glob("*.pt"))
    assert names and names == sorted(p.name for p in step_dir.glob("*.pt"))
    for name in names:
        got = tensors(torch.load(step_dir / name, map_location="cpu", weights_only=False))
        want = tensors(torch.load(reference_dir / name, map_location="cpu", weights_only=False))
        assert got.keys() == want.keys(), name
        differ = [k for k in want if not torch.equal(got[k], want[k])]
        assert not differ, f"{name}: tensors differ from the uninterrupted run: {differ[:5]}"


_references: dict = {}


@pytest.fixture
def reference(small_data, tmp_path_factory):
    """The uninterrupted run of a precision (or "compiled": fp32 with torch_compile): (losses
    by iteration, checkpoint root)."""
    def get(precision: str):
        if precision not in _references:
            run_dir = tmp_path_factory.mktemp(f"reference-{precision}")
            extra = {"bf16": {"bf16": "{enabled: true}"},
                     "compiled": {"torch_compile": True}}.get(precision, {})
            proc = run(small_data, run_dir, **extra)
            assert proc.returncode == 0, explain(proc)
            _references[precision] = (losses_by_iteration(run_dir), run_dir / "ckpt")
        return _references[precision]
    return get


def copy_checkpoints(reference_root: Path, run_dir: Path) -> Path:
    shutil.copytree(reference_root, run_dir / "ckpt")
    return run_dir / "ckpt"


def test_stop_and_resume_is_bitwise_identical_to_an_uninterrupted_run(small_data, tmp_path,
                                                                      reference):
    """fp32 on two data-parallel processes (bf16 stop and resume, at tensor x pipeline 2 x 2:
    tests/checkpointing/test_layouts_e2e.py)."""
    assert_stop_and_resume_exact(small_data, tmp_path, reference("fp32"))


@pytest.mark.slow
def test_exit_interval_exits_as_gpt_neox_does_and_step_0_is_saved_when_asked(small_data,
                                                                            tmp_path, reference):
    """GPT-NeoX's exit_interval ends the run after the step, saving only what that iteration's
    schedule saves (not the end-of-training evaluations and checkpoint); extra_save_iters [0]
    saves the model before the first step, as GPT-NeoX does. The run resumed from its last
    checkpoint trains as the uninterrupted one did, bit for bit."""
    from megatron.checkpointing.manifest import read_manifest

    want_losses, _ = reference("fp32")
    first = run(small_data, tmp_path, exit_interval=3, extra_save_iters="[0]")
    assert first.returncode == 0, explain(first)
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step0", "global_step2", "latest"]
    assert (ckpt / "latest").read_text() == "global_step2"
    assert read_manifest(ckpt / "global_step0").iteration == 0
    assert (f"exiting at iteration 3 (exit_interval=3) without a checkpoint of its own, as "
            f"GPT-NeoX does; a run goes on from {ckpt}/global_step2") in first.stdout
    assert "test at the end of training" not in first.stdout
    second = run(small_data, tmp_path)
    assert second.returncode == 0, explain(second)
    assert "from iteration 2 to 6" in second.stdout
    assert losses_by_iteration(tmp_path) == want_losses, EXACT_HINT


def test_compiled_layers_stop_and_resume_continue_the_uninterrupted_run(small_data, tmp_path,
                                                                       reference):
    """torch_compile: the compiled layers' dropout masks come from the generator state the
    checkpoint restores, so a resumed run continues the uninterrupted one: to fp32 rounding,
    not bit for bit, since inductor's CPU kernels (OpenMP) may sum in another order in another
    process (one run of several differed in the seventh digit of its last loss). The saved
    tensors likewise, relative to each tensor's scale, all but a few values: Adam's
    normalisation enlarges a round-off difference on a row that saw few tokens (once 10 of
    the 262,144 values of a 2048 x 128 vocabulary-sized tensor differed by up to 6.7e-6,
    another time 6 by up to 6.7e-5, 0.2% of those values). A mask drawn differently would
    move the loss, and every value, by far more."""
    want_losses, want_root = reference("compiled")
    first = run(small_data, tmp_path, exit_interval=3, extra_save_iters="[3]",
                torch_compile=True)
    assert first.returncode == 0, explain(first)
    second = run(small_data, tmp_path, torch_compile=True)
    assert second.returncode == 0, explain(second)
    assert "from iteration 3 to 6" in second.stdout
    got = losses_by_iteration(tmp_path)
    assert got.keys() == want_losses.keys()
    for iteration, loss in want_losses.items():
        assert got[iteration] == pytest.approx(loss, rel=1e-5), (iteration, got, want_losses)
    names = sorted(p.name for p in (want_root / "global_step6").glob("*.pt"))
    for name in names:
        mine = tensors(torch.load(tmp_path / "ckpt" / "global_step6" / name, map_location="cpu",
                                  weights_only=False))
        theirs = tensors(torch.load(want_root / "global_step6" / name, map_location="cpu",
                                    weights_only=False))
        assert mine.keys() == theirs.keys(), name
        for key, value in theirs.items():
            if value.is_floating_point():
                scale = value.abs().max().item()
                diff = (mine[key] - value).abs()
                off = (diff > 1e-4 * scale + 1e-4 * value.abs() + 1e-6).float().mean().item()
                assert off < 1e-4 and diff.max().item() < 1e-2 * scale + 1e-6, (
                    name, key, off, diff.max().item(), scale)
            else:
                assert torch.equal(mine[key], value), (name, key)


def assert_stop_and_resume_exact(small_data, run_dir: Path, reference, **extra) -> None:
    """Train to iteration 3, save and exit, resume to 6: the losses and final state equal the
    uninterrupted `reference` (losses by iteration, checkpoint root) bit for bit."""
    want_losses, want_root = reference
    first = run(small_data, run_dir, exit_interval=3, extra_save_iters="[3]", **extra)
    assert first.returncode == 0, explain(first)
    assert (run_dir / "ckpt" / "latest").read_text() == "global_step3"
    second = run(small_data, run_dir, **extra)
    assert second.returncode == 0, explain(second)
    assert "from iteration 3 to 6" in second.stdout
    assert losses_by_iteration(run_dir) == want_losses, EXACT_HINT
    assert_same_state(run_dir / "ckpt" / "global_step6", want_root / "global_step6")


def test_a_rank_killed_mid_save_then_a_full_disk_lose_nothing(small_data, tmp_path, reference):
    want_losses, want_root = reference("fp32")
    ckpt = tmp_path / "ckpt"
    killed = run(small_data, tmp_path, env={"MEGATRON_CHECKPOINT_FAULT": "kill:rank=1:iteration=4"})
    assert killed.returncode != 0
    assert (ckpt / "latest").read_text() == "global_step2"
    assert sorted(p.name for p in ckpt.iterdir()) == [".staging-global_step4", "global_step2",
                                                      "latest"]

    full = run(small_data, tmp_path, env={"MEGATRON_CHECKPOINT_FAULT": "enospc:rank=0:iteration=4"})
    assert full.returncode != 0
    assert "from iteration 2 to 6" in full.stdout, explain(full)
    assert f"removed {ckpt / '.staging-global_step4'}, left behind by an interrupted" in full.stderr
    assert f"checkpoint {ckpt / 'global_step4'} was not saved: rank 0: writing" in full.stderr
    assert "No space left on device" in full.stderr
    assert f"{ckpt / 'latest'} still names global_step2" in full.stderr
    assert "Traceback" not in full.stderr, explain(full)
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step2", "latest"]

    resumed = run(small_data, tmp_path)
    assert resumed.returncode == 0, explain(resumed)
    assert "from iteration 2 to 6" in resumed.stdout
    assert losses_by_iteration(tmp_path) == want_losses, EXACT_HINT
    assert_same_state(ckpt / "global_step6", want_root / "global_step6")


def test_damaged_checkpoints_are_reported_and_the_newest_valid_one_is_loaded(small_data,
                                                                            tmp_path, reference):
    want_losses, want_root = reference("fp32")
    ckpt = copy_checkpoints(want_root, tmp_path)
    flipped = ckpt / "global_step6" / "layer_02-model_00-model_states.pt"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40
    flipped.write_bytes(bytes(data))
    truncated = ckpt / "global_step4" / "mp_rank_00_model_states.pt"
    truncated.write_bytes(truncated.read_bytes()[:1000])

    proc = run(small_data, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert f"checkpoint {ckpt / 'global_step6'} is damaged and will not be loaded" in proc.stderr
    assert f"{flipped}: sha256" in proc.stderr and "corrupt" in proc.stderr
    assert f"{truncated}: 1000 bytes but the manifest recorded" in proc.stderr
    assert f"loading {ckpt / 'global_step2'} instead" in proc.stderr
    assert "from iteration 2 to 6" in proc.stdout
    got = losses_by_iteration(tmp_path)
    assert got == {i: want_losses[i] for i in range(3, STEPS + 1)}, EXACT_HINT
    assert_same_state(ckpt / "global_step6", want_root / "global_step6")

    (ckpt / "global_step6" / "manifest.json").unlink()
    (ckpt / "latest").write_text("global_step9")
    proc = run(small_data, tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert f"{ckpt / 'latest'} names 'global_step9' but" in proc.stderr
    assert f"{ckpt / 'global_step6' / 'manifest.json'}: missing" in proc.stderr
    assert "from iteration 4 to 6" in proc.stdout
    assert losses_by_iteration(tmp_path)[STEPS] == want_losses[STEPS], EXACT_HINT
    assert_same_state(ckpt / "global_step6", want_root / "global_step6")
    assert (ckpt / "latest").read_text() == "global_step6"


def test_a_different_data_parallel_size_loads_with_zero0(small_data, tmp_path, reference):
    want_losses, want_root = reference("fp32")
    copy_checkpoints(want_root, tmp_path)
    proc = run(small_data, tmp_path, num_gpus=1, train_iters=STEPS + 2,
               override_lr_scheduler=True)  # a longer run: the config's schedule wins
    assert proc.returncode == 0, explain(proc)
    assert "from iteration 6 to 8" in proc.stdout
    got = losses_by_iteration(tmp_path)
    assert sorted(got) == [7, 8] and got[8] < want_losses[1] - 0.3
