"""Where the values of `export_env_vars` (WANDB_API_KEY, HF_TOKEN, ...) go (A34): to the workers'
environment, never onto a command line, into a log, the saved config or a checkpoint.

    path = write_env_file(secrets, folder)   # deepy.py, hostfile launches: owner-only JSON
    load_env_file(os.environ)                # each worker, before anything else (run_entry)
    text = Redactor(secrets, [encoded_config]).clean(line)   # relayed launcher output

Workers this machine starts (no hostfile, or no_ssh) inherit them in their environment, which
only their owner can read. For a launch through DeepSpeed's runner (pdsh, mpirun, srun) the
runner would put each exported variable on the remote command (`export K=V;`, `-x K=V`,
`--export=ALL,K=V`) and print it; instead deepy.py writes the values to an owner-only file and
exports only its path, NEOX_ENV_FILE. Every node must read that file at the same path: it lives
in `env_file_dir` (default ~/.cache/neox; the home folder is shared on most clusters, else set
a folder on a shared filesystem). Workers never delete it (other nodes may still read it);
deepy.py removes it when the run ends. STARTUP_VARS matter before Python runs any code (the
module path, and the dynamic loader's, which NCCL's network plugins need), so they stay on the
runner's command line (DeepSpeed's runner exports PYTHON* itself): keep secrets out of them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import tempfile
from pathlib import Path
from typing import Iterable, MutableMapping

ENV_FILE_VAR = "NEOX_ENV_FILE"
DEFAULT_ENV_FILE_DIR = "~/.cache/neox"
STARTUP_VARS = ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD")
HIDDEN, CONFIG = "<hidden>", "<config>"
MIN_BARE_VALUE = 8  # shorter values are hidden only where assigned (K=V), not everywhere
PATH_STARTS = ("/", "~/", "./", "../")  # a value naming a file or folder is not a credential


def secret_values(exported: dict[str, str]) -> dict[str, str]:
    """The exported variables that travel in the env file (all but STARTUP_VARS)."""
    return {k: v for k, v in exported.items() if k not in STARTUP_VARS}


def write_env_file(values: dict[str, str], folder: str | None) -> str:
    """Write `values` to a new owner-only file in `folder`; its path."""
    where = Path(os.path.expanduser(folder or DEFAULT_ENV_FILE_DIR))
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="neox_env_", suffix=".json", dir=where)
    except OSError as err:
        raise PermissionError(f"env_file_dir {where}: cannot create the file carrying "
                              f"export_env_vars to the workers ({err.strerror}); set env_file_dir "
                              "to a writable folder that every node reads at the same path") \
            from None
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)  # mkstemp's mode already; said out loud
    with os.fdopen(fd, "w") as f:
        json.dump(values, f)
    return path


def load_env_file(environ: MutableMapping[str, str]) -> list[str]:
    """On a worker: set the variables of the file NEOX_ENV_FILE names; the names set."""
    path = environ.get(ENV_FILE_VAR)
    if not path:
        return []
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not JSON"
        raise RuntimeError(
            f"{ENV_FILE_VAR}={path} cannot be read on {socket.gethostname()} ({reason}): it "
            "carries export_env_vars to the workers and must be at the same path on every "
            "node; set env_file_dir to a folder on a shared filesystem") from None
    environ.update({str(k): str(v) for k, v in values.items()})
    return list(values)


class Redactor:
    """Hides secret values (K=<hidden>) and the encoded config (<config>) in printed text.

    Every exported value is hidden where it is assigned (`K=V`, `-genv K V`). Where it appears
    on its own, a value of MIN_BARE_VALUE characters or more is hidden too, except a path
    (`HF_HOME=/scratch/me/hf`: the paths the run prints under it stay readable; a credential
    is not a path, and a credentials file's path is not the secret)."""

    def __init__(self, secrets: dict[str, str], hidden_blobs: Iterable[str] = ()):
        self.blobs = [b for b in hidden_blobs if b]
        self.values = sorted({v for v in secrets.values()
                              if len(v) >= MIN_BARE_VALUE and not _is_path(v)},
                             key=len, reverse=True)
        names = "|".join(re.escape(k) for k in secrets)
        # K=V, K="V", and `-genv K V` (Intel MPI's form)
        self.assigned = re.compile(rf"(\b(?:{names})=|-g?env\s+(?:{names})\s+)"
                                   r"(\"[^\"]*\"|'[^']*'|[^\s;,]+)") if names else None

    def clean(self, text: str) -> str:
        for blob in self.blobs:
            text = text.replace(blob, CONFIG)
        for value in self.values:
            text = text.replace(value, HIDDEN)
        if self.assigned is not None:
            text = self.assigned.sub(lambda m: m.group(1) + HIDDEN, text)
        return text


def _is_path(value: str) -> bool:
    """A file or folder name: absolute, in the home folder or relative, without spaces."""
    return value.startswith(PATH_STARTS) and not any(c.isspace() for c in value)
