"""Where training metrics go: the console, `<log_dir>/metrics.jsonl`, TensorBoard, wandb.

Only the rank that owns the logged values (global rank 0) writes. Optional trackers that are
configured but not installed fail with the install command (A7); wandb without credentials logs
offline and says so (A2).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from megatron.monitoring.logger import get_logger, print_rank_0

log = get_logger(__name__)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsTracker:
    """Fan one dict of metrics per log step out to every configured sink."""

    def __init__(self, log_dir: str | None, tensorboard_dir: str | None, wandb_cfg: dict | None,
                 run_config: dict, enabled: bool):
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self._jsonl = open(Path(log_dir) / "metrics.jsonl", "a", encoding="utf-8")
        if tensorboard_dir:
            self._tb = _open_tensorboard(tensorboard_dir)
        if wandb_cfg is not None:
            self._wandb = _open_wandb(wandb_cfg, run_config)

    @classmethod
    def from_args(cls, args, enabled: bool) -> "MetricsTracker":
        """The trackers the run config's logging section asks for."""
        lg = args.logging
        wandb_cfg = None
        if wandb_enabled(lg.use_wandb):
            wandb_cfg = {"project": lg.wandb_project, "group": lg.wandb_group,
                         "team": lg.wandb_team, "run_name": lg.wandb_run_name, "dir": lg.log_dir}
        return cls(lg.log_dir, lg.tensorboard_dir, wandb_cfg, args.to_dict(), enabled=enabled)

    def log(self, metrics: dict, step: int, console: str | None = None) -> None:
        """Record `metrics` at iteration `step`; `console` is the human line printed with them."""
        if not self.enabled:
            return
        if console:
            print_rank_0(console)
        record = {"iteration": step, "time": time.time(), **{k: _jsonable(v) for k, v in metrics.items()}}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _open_tensorboard(tensorboard_dir: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RuntimeError("tensorboard_dir is set but tensorboard is not installed: "
                           "pip install -r requirements/requirements-tensorboard.txt, or unset "
                           "tensorboard_dir") from None
    return SummaryWriter(log_dir=tensorboard_dir)


def wandb_enabled(use_wandb: bool | None) -> bool:
    """use_wandb as given; null (GPT-NeoX's default) is on when wandb is installed and has
    credentials on this worker."""
    if use_wandb is not None:
        return bool(use_wandb)
    import importlib.util

    return importlib.util.find_spec("wandb") is not None and wandb_has_credentials()


def wandb_has_credentials() -> bool:
    """An API key in the environment or a ~/.netrc entry for the wandb host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def _open_wandb(cfg: dict, run_config: dict):
    try:
        import wandb
    except ImportError:
        raise RuntimeError("use_wandb is on but wandb is not installed: "
                           "pip install -r requirements/requirements-wandb.txt, or set "
                           "use_wandb: false") from None
    mode = os.environ.get("WANDB_MODE")
    if mode is None and not wandb_has_credentials():
        log.warning("use_wandb is on but no wandb credentials reached this worker (WANDB_API_KEY "
                    "unset, no ~/.netrc entry): logging offline; sync later with `wandb sync`")
        mode = "offline"
    return wandb.init(project=cfg.get("project"), group=cfg.get("group"), entity=cfg.get("team"),
                      name=cfg.get("run_name"), dir=cfg.get("dir"), config=run_config,
                      mode=mode, reinit=True)
