"""The lm-eval versions the adapter is written for, checked before lm_eval is imported (A28).

The adapter uses lm-eval's 0.4 API: `lm_eval.api.model.LM` (loglikelihood,
loglikelihood_rolling, generate_until over `Instance.args`), `lm_eval.simple_evaluate` and
`lm_eval.tasks.TaskManager(include_path=...)`.
"""

from __future__ import annotations

import re
from importlib import metadata

MINIMUM = (0, 4, 2)
BELOW = (0, 5, 0)
REQUIREMENT = "lm-eval>=0.4.2,<0.5"
INSTALL = "pip install -r requirements/requirements-eval.txt"


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as '0.4.13' or '0.4.3.dev0'."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if match is None:
        raise RuntimeError(f"cannot read the lm-eval version {text!r}; install {REQUIREMENT}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def check_lm_eval_version(version: str) -> None:
    """RuntimeError unless MINIMUM <= version < BELOW."""
    if not MINIMUM <= parse_version(version) < BELOW:
        raise RuntimeError(f"lm-eval {version} is installed, but the eval adapter is written for "
                           f"{REQUIREMENT} (the 0.4 LM / simple_evaluate / TaskManager API); "
                           f"run: {INSTALL}")


def require_lm_eval() -> str:
    """The installed lm-eval version, checked; a clear error when it is missing or unsupported."""
    try:
        version = metadata.version("lm_eval")
    except metadata.PackageNotFoundError:
        raise RuntimeError(f"eval.py needs lm-eval, which is not installed: {INSTALL}") from None
    check_lm_eval_version(version)
    return version
