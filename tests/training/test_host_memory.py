"""On CPUs the training worker keeps freed host memory for the next step: a step's worth of
large tensors allocated again costs no page faults; a user's own glibc settings are left alone."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.runs import ROOT

# allocate and free the same large tensors a few times, as steps do; print page faults of the
# last rounds (after four have grown the heap to its working size)
PROGRAM = """
import resource, sys, torch
from megatron.training.host_memory import keep_freed_memory
line = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    a = torch.ones(64 * 2**20 // 4); b = torch.ones(48 * 2**20 // 4); c = torch.ones(8 * 2**20 // 4)
    return float(a[0] + b[0] + c[0])
for _ in range(4):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, line is not None)
"""


def faults(mode: str, **env) -> tuple[int, bool]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), out[1] == "True"


def test_freed_tensors_are_reused_without_page_faults():
    default, said = faults("default")
    kept, said_kept = faults("keep")
    # 120 MiB per round is about 30,000 pages of 4 KiB faulted in again each time by default
    assert default > 3 * 20_000 and not said
    assert kept < 1_000 and said_kept


def test_a_users_glibc_setting_is_left_alone():
    kept, said = faults("keep", MALLOC_MMAP_MAX_="65536")
    assert not said and kept > 3 * 20_000
