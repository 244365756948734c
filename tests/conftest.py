"""Test-wide settings: CPU only, wandb offline, quiet DeepSpeed, few threads per process, Triton
interpreted."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton's interpreter runs the fused kernels on CPU tensors (megatron.model.fusions.triton_on_cpu);
# it is chosen when triton is imported, so here. The GPU tier compiles them instead.
if os.environ.get("DS_ACCELERATOR", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")
    config.addinivalue_line("markers", "slow: among the longest runs; skip locally with "
                                       "PYTEST_ARGS='-m \"not slow\"' (CI runs everything)")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """(data prefix, tokenizer path) of a real dataset built from the built-in corpus, shared
    by every test of the session that runs real training."""
    from tests.runs import build_small_dataset

    return build_small_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """configs/tiny.yml trained briefly, once per session: {"data", "tokenizer", "ckpt",
    "overrides"} (tests/text_generation/models.trained_checkpoint)."""
    from tests.text_generation.models import trained_checkpoint

    return trained_checkpoint(tmp_path_factory.getbasetemp() / "trained_tiny")


# Every process this test session starts inherits this tag, so that the cleanup below finds the
# session's own leftovers and never another session's runs.
SESSION_TAG = "NEOX_TEST_SESSION"
os.environ[SESSION_TAG] = f"{os.getpid()}-{os.urandom(4).hex()}"


@pytest.fixture(autouse=True)
def _no_leftover_workers():
    """After each test, kill what a launch of this session left running: a test that timed out
    kills deepy.py only, and its workers would otherwise load the cores for the rest of the
    session."""
    yield
    import psutil

    from megatron.launching.stopping import LAUNCH_ID_VAR

    me, left, tag = os.getpid(), [], os.environ[SESSION_TAG]
    for proc in psutil.process_iter():
        try:
            env = proc.environ() if proc.pid != me else {}
            if LAUNCH_ID_VAR in env and env.get(SESSION_TAG) == tag:
                proc.kill()
                left.append(proc)
        except (psutil.Error, OSError):
            continue
    psutil.wait_procs(left, timeout=10)
