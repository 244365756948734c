"""Where training metrics go: the console, `<log_dir>/metrics.jsonl`, TensorBoard, wandb.

Only the rank that owns the logged values (global rank 0) writes. Optional trackers that are
configured but not installed fail with the install command (A7); wandb without credentials logs
offline and says so (A2).
"""

from __future__ import annotations

import json
import math
import netrc
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from megatron.monitoring.logger import get_logger, print_rank_0

log = get_logger(__name__)

DEFAULT_WANDB_HOST = "https://api.wandb.ai"  # GPT-NeoX's default wandb_host


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
        if wandb_enabled(lg.use_wandb, lg.wandb_host):
            wandb_cfg = {"project": lg.wandb_project, "group": lg.wandb_group,
                         "team": lg.wandb_team, "run_name": lg.wandb_run_name, "dir": lg.log_dir,
                         "host": lg.wandb_host}
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


def wandb_enabled(use_wandb: bool | None, wandb_host: str = DEFAULT_WANDB_HOST) -> bool:
    """use_wandb as given; null (GPT-NeoX's default) is on when wandb is installed and has
    credentials for the wandb server on this worker."""
    if use_wandb is not None:
        return bool(use_wandb)
    import importlib.util

    return (importlib.util.find_spec("wandb") is not None
            and wandb_has_credentials(wandb_server(wandb_host)))


def wandb_server(wandb_host: str) -> str:
    """The wandb server a run logs to: `wandb_host`, except that at its default a
    WANDB_BASE_URL set in the environment (which wandb itself reads) is kept."""
    from_env = os.environ.get("WANDB_BASE_URL")
    return from_env if from_env and wandb_host == DEFAULT_WANDB_HOST else wandb_host


def wandb_has_credentials(host: str = DEFAULT_WANDB_HOST) -> bool:
    """An API key in the environment, or a .netrc entry for `host` (machine = the URL's
    host[:port], as `wandb login --host` writes it; the file is $NETRC or ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    if not path.is_file():
        return False
    try:
        entry = netrc.netrc(path).authenticators(urlsplit(host).netloc)
    except (netrc.NetrcParseError, OSError) as err:
        log.warning("cannot read %s for wandb credentials: %s", path, err)
        return False
    return bool(entry and entry[2])


def _open_wandb(cfg: dict, run_config: dict):
    try:
        import wandb
    except ImportError:
        raise RuntimeError("use_wandb is on but wandb is not installed: "
                           "pip install -r requirements/requirements-wandb.txt, or set "
                           "use_wandb: false") from None
    host = wandb_server(cfg.get("host") or DEFAULT_WANDB_HOST)
    from_env = os.environ.get("WANDB_BASE_URL")
    if from_env and from_env != host:
        log.warning("WANDB_BASE_URL=%s is ignored: wandb_host is set to %s", from_env, host)
    mode = os.environ.get("WANDB_MODE")
    if mode is None and not wandb_has_credentials(host):
        log.warning("use_wandb is on but no wandb credentials for %s reached this worker "
                    "(WANDB_API_KEY unset, no ~/.netrc entry for %s): logging offline; sync later "
                    "with `wandb sync`", host, urlsplit(host).netloc)
        mode = "offline"
    return wandb.init(project=cfg.get("project"), group=cfg.get("group"), entity=cfg.get("team"),
                      name=cfg.get("run_name"), dir=cfg.get("dir"), config=run_config,
                      mode=mode, reinit=True, settings=wandb.Settings(base_url=host))
