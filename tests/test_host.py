"""What deepy.py learns about this machine without importing torch (megatron/host.py), and that
it starts workers without importing torch at all: the seconds that import takes were spent
before every launch, before any worker ran."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from megatron.host import GPU_BACKENDS, cpu_only_build, cuda_available, no_gpu_backend
from megatron.launching.local import CPU_VISIBLE_DEVICES_VAR, local_launch, worker_env
from tests.runs import ROOT, clean_env


def test_the_build_read_from_its_version_file_is_the_one_torch_reports():
    assert cpu_only_build() == all(getattr(torch.version, name, None) is None
                                   for name in GPU_BACKENDS)
    assert cuda_available() == torch.cuda.is_available()


def test_a_version_file_naming_a_gpu_backend_or_missing_one_is_not_cpu_only():
    cpu = "cuda: Optional[str] = None\nhip: Optional[str] = None\nxpu: Optional[str] = None\n"
    assert no_gpu_backend("from typing import Optional\n__version__ = '2.13.0+cpu'\n" + cpu)
    assert not no_gpu_backend(cpu.replace("cuda: Optional[str] = None", "cuda = '12.8'"))
    assert not no_gpu_backend(cpu.replace("hip: Optional[str] = None", "hip = '6.3.4'"))
    assert not no_gpu_backend(cpu.replace("xpu: Optional[str] = None\n", ""))  # an older torch
    assert not no_gpu_backend("cuda = (")  # unreadable: torch itself is asked


def test_on_the_cpu_the_workers_see_the_devices_deepspeeds_cpu_accelerator_would_set():
    here = local_launch({"n0": [0, 1], "n1": [2, 3]}, 1, "10.0.0.1", 29500)
    ours = worker_env({"DS_ACCELERATOR": "cpu"}, here, 0, "id")
    theirs = dict(ours)
    CPU_Accelerator().set_visible_devices_envs(theirs, list(here.device_ids))
    assert CPU_Accelerator().visible_devices_envs() == [CPU_VISIBLE_DEVICES_VAR]
    assert ours == theirs and ours[CPU_VISIBLE_DEVICES_VAR] == "2,3"


LAUNCH_UP_TO_THE_WORKERS = """
import json, sys
import megatron.launcher as launcher
from megatron.entry import run_entry
from megatron.launching.local import local_launch, worker_env

def run_plan(args, plan):  # where the workers would start
    hosts = {h: list(s) for h, s in plan.hosts.items()}
    worker_env(dict(__import__("os").environ), local_launch(hosts, 0, "127.0.0.1", 1), 0, "id")
    print(json.dumps({"world": plan.world_size,
                      "imported": sorted(m for m in ("torch", "deepspeed", "numpy.random")
                                         if m in sys.modules)}))
    return 0

launcher.run_plan = run_plan
sys.exit(run_entry(lambda: launcher.launch(sys.argv[1], sys.argv[2:])))
"""


BUILTIN = "data/builtin/builtin_text_document"
LABELS = ["data_path=null", *(f"{split}_{kind}data_paths=[{BUILTIN}]"  # tokens as their own labels
                              for split in ("train", "valid", "test") for kind in ("", "label_"))]
CASES = {"train": ("train.py", []),
         "train-labels": ("train.py", LABELS),  # the label files are checked before launch
         "train-mamba": ("train.py", ["configs/tiny_mamba.yml"]),
         "train-pipeline": ("train.py", ["pipe_parallel_size=2"]),  # DeepSpeed's stages, counted
         "train-bf16": ("train.py", ["precision=bfloat16"]),  # how CPU bf16 products run
         "generate": ("generate.py", ["configs/text_generation.yml",
                                      "sample_output_file={tmp}/samples.jsonl"]),
         "eval": ("eval.py", ["eval_tasks=[tests/evaluation/tasks/tiny_mc.yaml]"])}


@pytest.mark.parametrize("case", list(CASES))
def test_deepy_checks_the_config_and_reaches_the_workers_without_importing_torch(tmp_path, case,
                                                                                trained):
    """Config, preflight (data files, memory estimate with generation's KV cache, the
    checkpoint's manifest), plan and worker environment of a two-process run of the tiny
    config, as `python deepy.py <script>` makes them (the built-in data as `make data` writes
    it; generation and evaluation read a trained checkpoint)."""
    script, extra = CASES[case]
    subprocess.run([sys.executable, "tools/datasets/prepare_data.py", "builtin", "-d", "data"],
                   cwd=ROOT, check=True, capture_output=True, env=clean_env())
    env = clean_env()
    env.pop("DS_ACCELERATOR", None)  # deepy.py decides it, as for a user
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH_UP_TO_THE_WORKERS, script, "configs/tiny.yml",
         *(a.format(tmp=tmp_path) for a in extra), "num_gpus=2",
         f"save={tmp_path / 'ck'}", f"log_dir={tmp_path / 'logs'}",
         *([f"load={tmp_path / 'ck'}"] if script == "train.py" else trained["overrides"])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"memory estimate for {script}" in proc.stderr  # the preflight ran
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["world"] == 2
    if cpu_only_build():
        assert report["imported"] == []
