"""tools/ckpts/convert_hf_to_neox.py refusals: what a user gets for a save directory that holds
this or a later iteration, damaged weight files, out-of-range options and a file given as
--hf_model; and its --help.

What a user relies on: each refusal is one line naming the path or option and what to do; the
refusals that need no weights come before any weight is read (shown with a model whose weight
file is damaged: reading it would give the damaged-file error instead); nothing is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from megatron.checkpointing.weights_only import config_for_tp
from megatron.model.hf_mapping import HF_CLASSES
from megatron.neox_arguments import NeoXArgs
from tests.tools.test_hf_conversion import data, hf_gpt_neox, tool  # data: a fixture


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """An HF GPTNeoXForCausalLM with configs/tiny.yml's shape, saved as safetensors."""
    out = tmp_path_factory.mktemp("hf") / "tiny"
    hf_gpt_neox(vocab=2048).save_pretrained(out)
    return out


def damaged(hf_dir: Path, out: Path, name: str = "model.safetensors") -> Path:
    """A copy of the model in `hf_dir` whose weight file `name` holds only its first half, as an
    interrupted download leaves it; pytorch_model.bin is written as transformers 4 wrote it."""
    out.mkdir()
    shutil.copy(hf_dir / "config.json", out)
    if name == "pytorch_model.bin":
        from safetensors.torch import load_file

        torch.save(load_file(hf_dir / "model.safetensors"), out / name)
    else:
        shutil.copy(hf_dir / name, out)
    whole = (out / name).read_bytes()
    (out / name).write_bytes(whole[:len(whole) // 2])
    return out


def convert(hf: Path, data, out: Path, *options: str) -> int:
    """The import script run as a user runs it, with configs/tiny.yml and the test data."""
    return tool("convert_hf_to_neox").main(["--hf_model", str(hf), "--config_file",
                                            "configs/tiny.yml", str(data[2]), "--output_dir",
                                            str(out), *options])


def snapshot(root: Path) -> dict[str, tuple[int, int] | str]:
    """Every path under `root` with its size and modification time, and `latest`'s text."""
    files = {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
             for p in sorted(root.rglob("*"))}
    return {**files, "latest text": (root / "latest").read_text()}


def last_error(capsys) -> str:
    return capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("iteration", [0, 3, 4])
def test_a_save_dir_holding_this_or_a_later_iteration_is_refused_before_reading_weights(
        iteration, data, hf_dir, tmp_path, capsys):
    save = tmp_path / "ckpt"
    assert convert(hf_dir, data, save, "--iteration", "4") == 0
    before = snapshot(save)
    broken = damaged(hf_dir, tmp_path / "broken")
    assert convert(broken, data, save, "--iteration", str(iteration)) == 1
    if iteration == 4:
        assert last_error(capsys) == (
            f"error: {save}/global_step4 already exists; choose another iteration or output "
            "directory (an existing checkpoint is never overwritten)")
    else:
        assert last_error(capsys) == (
            f"error: {save} already holds global_step4, later than global_step{iteration}: "
            f"writing global_step{iteration} would point {save}/latest back to it and the next "
            f"run would resume from global_step{iteration} instead of global_step4; choose "
            "another --output_dir, or --iteration above 4")
    assert snapshot(save) == before


def test_a_later_iteration_imports_into_a_save_dir(data, hf_dir, tmp_path):
    save = tmp_path / "ckpt"
    assert convert(hf_dir, data, save, "--iteration", "4") == 0
    assert convert(hf_dir, data, save, "--iteration", "5") == 0
    assert (save / "latest").read_text() == "global_step5"
    assert sorted(p.name for p in save.iterdir()) == ["global_step4", "global_step5", "latest"]


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_truncated_weight_file_is_named_in_one_line(name, data, hf_dir, tmp_path, capsys):
    broken = damaged(hf_dir, tmp_path / "broken", name)
    assert convert(broken, data, tmp_path / "ckpt") == 1
    err = capsys.readouterr().err
    reason = {"model.safetensors": "Error while deserializing header: incomplete metadata, file "
                                   "not fully covered",
              "pytorch_model.bin": "PytorchStreamReader failed reading zip archive: failed "
                                   "finding central directory"}[name]
    assert err.splitlines()[-1] == (f"error: {broken / name} is damaged or incomplete ({reason}); "
                                    "re-download it or re-save the model")
    assert "Traceback" not in err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("option, message", [
    (["--tp", "0"], "--tp 0 must be at least 1 (the tensor-parallel degree to split for; leave "
                    "--tp out for the config's model_parallel_size)"),
    (["--tp", "-1"], "--tp -1 must be at least 1 (the tensor-parallel degree to split for; leave "
                     "--tp out for the config's model_parallel_size)"),
    (["--iteration", "-5"], "--iteration -5 is negative; a checkpoint's iteration (N of "
                            "global_step<N>) is 0 or more")])
def test_out_of_range_tp_and_iteration_are_refused(option, message, data, hf_dir, tmp_path,
                                                   capsys):
    assert convert(hf_dir, data, tmp_path / "ckpt", *option) == 1
    assert last_error(capsys) == f"error: {message}"
    assert not (tmp_path / "ckpt").exists()


def test_a_tp_below_1_is_refused_by_the_checkpoint_writer(data):
    args = NeoXArgs.from_ymls(["configs/tiny.yml", data[2]])
    with pytest.raises(ValueError, match=r"^model_parallel_size\(0\) must be at least 1\.$"):
        config_for_tp(args, 0)


def test_hf_model_given_as_its_config_file_names_the_directory(data, hf_dir, tmp_path, capsys):
    assert convert(hf_dir / "config.json", data, tmp_path / "ckpt") == 1
    assert last_error(capsys) == (f"error: --hf_model {hf_dir}/config.json is a file; give the "
                                  f"Hugging Face model directory that holds it ({hf_dir})")
    assert not (tmp_path / "ckpt").exists()


def test_help_gives_the_whole_description_and_every_architecture(capsys):
    script = tool("convert_hf_to_neox")
    with pytest.raises(SystemExit) as stop:
        script.main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert script.__doc__.strip() in out
    assert "choose another --output_dir or a later --iteration." in out  # its last sentence
    for name in HF_CLASSES.values():  # every architecture hf_model_config maps
        assert name in out, name
