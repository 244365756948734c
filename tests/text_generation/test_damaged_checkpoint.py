"""Every reader verifies a checkpoint before using it: generation, eval and Hugging Face export
refuse a checkpoint with one flipped byte (or no manifest), naming the damaged file the way
training does, and write nothing."""

import logging
import shutil

import pytest

from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT

CONFIGS = [str(ROOT / "configs/tiny.yml"), str(ROOT / "configs/text_generation.yml")]


@pytest.fixture(autouse=True)
def own_log_handlers(monkeypatch):
    # entry scripts install a log handler on the stderr of their time: give each call its own
    monkeypatch.setattr(logging.getLogger("megatron"), "handlers", [])


@pytest.fixture
def damaged(trained, tmp_path):
    """A copy of the trained checkpoint with one byte of one layer file flipped:
    (save directory, the flipped file)."""
    save = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], save)
    step = save / (save / "latest").read_text().strip()
    target = sorted(step.glob("layer_02-model_00-model_states.pt"))[0]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    return save, target


def args_for(trained, save, tmp_path, **values):
    values = {"num_gpus": 1, "load": str(save), "sample_output_file": str(tmp_path / "out.jsonl"),
              "maximum_tokens": 4, "text_gen_type": "unconditional", "num_samples": 1, **values}
    keep = [o for o in trained["overrides"] if not o.startswith("load=")]
    return NeoXArgs.from_ymls(CONFIGS, keep + [f"{k}={v}" for k, v in values.items()])


def assert_names_the_file(err: str, step, target):
    """One error (no traceback) that names the checkpoint and the damaged file."""
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"checkpoint {step} is damaged and will not be loaded" in lines[0]
    assert f"  - {target}: sha256" in err and "differs from the manifest's" in err


def test_generation_refuses_a_flipped_byte(trained, damaged, tmp_path, one_rank, capsys):
    import generate

    save, target = damaged
    args = args_for(trained, save, tmp_path)
    assert generate.main(["--neox_args", args.encode()]) == 1
    assert_names_the_file(capsys.readouterr().err, target.parent, target)
    assert not (tmp_path / "out.jsonl").exists()


def test_eval_refuses_a_flipped_byte(trained, damaged, tmp_path, one_rank, capsys):
    import eval as eval_entry

    save, target = damaged
    args = args_for(trained, save, tmp_path, eval_tasks="[tiny_mc]",
                    eval_include_path=str(ROOT / "tests/evaluation/tasks"),
                    eval_results_prefix=str(tmp_path / "results"))
    assert eval_entry.main(["--neox_args", args.encode()]) == 1
    assert_names_the_file(capsys.readouterr().err, target.parent, target)
    assert not list(tmp_path.glob("results*"))


def test_export_refuses_a_flipped_byte_and_writes_nothing(trained, damaged, tmp_path, capsys):
    from tests.tools.test_hf_conversion import tool

    save, target = damaged
    out = tmp_path / "hf"
    assert tool("convert_neox_to_hf").main(["--input_dir", str(save),
                                            "--output_dir", str(out)]) == 1
    assert_names_the_file(capsys.readouterr().err, target.parent, target)
    assert not out.exists()


def test_a_checkpoint_without_manifest_is_refused_by_readers(trained, tmp_path, one_rank):
    from megatron.checkpointing import CorruptFileError, read_checkpoint

    save = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], save)
    step = save / (save / "latest").read_text().strip()
    (step / "manifest.json").unlink()
    with pytest.raises(CorruptFileError, match=r"is damaged and will not be loaded:\n  - "
                                               r".*manifest.json: missing"):
        read_checkpoint(save)
    assert read_checkpoint(trained["ckpt"]).iteration == 30  # the intact original reads


@pytest.mark.parametrize("script", ["generate.py", "eval.py"])
def test_a_truncated_or_missing_file_is_refused_before_any_worker(trained, tmp_path, script):
    """deepy.py compares each file's size with the manifest before any worker starts (the
    workers hash them all): a truncated layer file and a missing one are named in the message
    the workers would print, and a manifest that is not JSON is refused the same way."""
    from megatron.checkpointing.errors import CorruptFileError
    from megatron.preflight import preflight

    save = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], save)
    step = save / (save / "latest").read_text().strip()
    truncated, missing = step / "layer_02-model_00-model_states.pt", step / "rng"
    size = truncated.stat().st_size
    with open(truncated, "r+b") as f:
        f.truncate(size - 100)
    rng_files = sorted(p for p in missing.rglob("*") if p.is_file())
    rng_files[0].unlink()
    extra = dict(eval_tasks="[tiny_mc]", eval_include_path=str(ROOT / "tests/evaluation/tasks"),
                 eval_results_prefix=str(tmp_path / "results")) if script == "eval.py" else {}
    args = args_for(trained, save, tmp_path, **extra)
    with pytest.raises(CorruptFileError) as err:
        preflight(args, script)
    text = str(err.value)
    assert text.startswith(f"checkpoint {step} is damaged and will not be loaded:\n  - ")
    assert f"  - {truncated}: {size - 100} bytes but the manifest recorded {size} (truncated)" \
        in text
    assert f"  - {rng_files[0]}: missing (the manifest lists it with " in text
    assert text.endswith("pick another checkpoint (iteration=<N>, or its global_step<N> directory)")

    (step / "manifest.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match=f"^checkpoint {step} is damaged and will not be "
                                               "loaded:\n  - .*manifest.json"):
        preflight(args, script)
