"""Where training metrics go: the console, `<log_dir>/metrics.jsonl`, TensorBoard, wandb, Comet.

Only the rank that owns the logged values (global rank 0) writes. metrics.jsonl keeps flat
names (`lm_loss`, `val_loss`, ...); TensorBoard, wandb and Comet get GPT-NeoX's tags
(`train/lm_loss`, `validation/lm_loss`, `runtime/tokens_per_sec`, ...: TRACKER_TAGS), so
dashboards built for GPT-NeoX runs show these too. Optional trackers that are configured but not installed fail with the install
command, before any worker starts (`check_trackers_installed`, A7); wandb and Comet without
credentials log offline and say so (A2).
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


# metrics.jsonl name -> (the tag TensorBoard, wandb and Comet get, as GPT-NeoX names it; the
# factor from our unit to that tag's). Names with a '/' keep theirs; others go under train/.
TRACKER_TAGS = {
    "lm_loss": ("train/lm_loss", 1.0),
    "learning_rate": ("train/learning_rate", 1.0),
    "grad_norm": ("train/grad_norm", 1.0),
    "consumed_samples": ("train/consumed_samples", 1.0),
    "tokens_per_sec": ("runtime/tokens_per_sec", 1.0),
    "samples_per_sec": ("runtime/samples_per_sec", 1.0),
    "iteration_time_ms": ("runtime/iteration_time", 1e-3),  # GPT-NeoX's is in seconds
    "data_wait_ms": ("runtime/data_wait_ms", 1.0),
    "memory_gib": ("runtime/memory_gib", 1.0),
    "model_tflops_per_gpu": ("runtime/flops_per_sec_per_gpu", 1e12),  # in FLOP/s
    "mfu": ("runtime/model_flops_utilization", 1.0),
    "val_loss": ("validation/lm_loss", 1.0),
    "val_ppl": ("validation/lm_loss_ppl", 1.0),
    "test_loss": ("test/lm_loss", 1.0),
    "test_ppl": ("test/lm_loss_ppl", 1.0),
}


def tracker_tag(name: str, value: float) -> tuple[str, float]:
    """(tag, value) as TensorBoard, wandb and Comet show the metric `name` (see TRACKER_TAGS)."""
    if "/" in name:
        return name, value
    tag, factor = TRACKER_TAGS.get(name, (f"train/{name}", 1.0))
    return tag, value * factor if factor != 1.0 else value


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


METRICS_FILE = "metrics.jsonl"


def set_aside_later_records(path: Path, start_iteration: int) -> Path | None:
    """Before training writes to metrics.jsonl from `start_iteration` on: when the file holds
    records past it (an earlier run in the same log_dir, when a run starts at 0; the steps after
    the checkpoint a run resumes from, which it does again), move the file to
    metrics.<date>.jsonl, keep the records up to `start_iteration` in metrics.jsonl, and say so.
    Returns where the old file went, or None when nothing moved."""
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept, later = [], 0
    for line in lines:
        try:
            iteration = json.loads(line).get("iteration")
        except (ValueError, AttributeError):
            iteration = None  # a line cut by a crash: kept with the old file only
        if start_iteration and isinstance(iteration, int) and iteration <= start_iteration:
            kept.append(line)
        elif isinstance(iteration, int):  # (a line cut by a crash is not counted)
            later += 1
    if not later:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    n = 1
    while moved.exists():
        n += 1
        moved = path.with_name(f"{path.stem}.{stamp}-{n}{path.suffix}")
    os.replace(path, moved)
    path.write_text("".join(kept), encoding="utf-8")
    records = f"{later} record{'s' if later != 1 else ''}"
    if start_iteration == 0:
        log.info("%s holds %s of an earlier run; they are kept in %s, and this run starts a "
                 "new %s", path, records, moved.name, path.name)
    else:
        log.info("%s holds %s past iteration %d (steps after the checkpoint this run resumes "
                 "from, done again now); the file as it was is kept in %s, and %s keeps the %d "
                 "records up to iteration %d", path, records, start_iteration, moved.name,
                 path.name, len(kept), start_iteration)
    return moved


class MetricsTracker:
    """Fan one dict of metrics per log step out to every configured sink."""

    def __init__(self, log_dir: str | None, tensorboard_dir: str | None, wandb_cfg: dict | None,
                 run_config: dict, enabled: bool, comet_cfg: dict | None = None,
                 start_iteration: int | None = None):
        """`start_iteration`: training's, which sets aside the records metrics.jsonl holds past
        it (set_aside_later_records)."""
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        self._wandb = None
        self._comet = None
        if not enabled:
            return
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            path = Path(log_dir) / METRICS_FILE
            if start_iteration is not None:
                set_aside_later_records(path, start_iteration)
            self._jsonl = open(path, "a", encoding="utf-8")
        if tensorboard_dir:
            self._tb = _open_tensorboard(tensorboard_dir)
        if wandb_cfg is not None:
            self._wandb = _open_wandb(wandb_cfg, run_config)
        if comet_cfg is not None:
            self._comet = _open_comet(comet_cfg, run_config)

    @classmethod
    def from_args(cls, args, enabled: bool,
                  start_iteration: int | None = None) -> "MetricsTracker":
        """The trackers the run config's logging section asks for."""
        lg = args.logging
        wandb_cfg = comet_cfg = None
        if wandb_enabled(lg.use_wandb, lg.wandb_host):
            wandb_cfg = {"project": lg.wandb_project, "group": lg.wandb_group,
                         "team": lg.wandb_team, "run_name": lg.wandb_run_name, "dir": lg.log_dir,
                         "host": lg.wandb_host}
        if lg.use_comet:
            comet_cfg = {"workspace": lg.comet_workspace, "project": lg.comet_project,
                         "name": lg.comet_experiment_name, "tags": lg.comet_tags,
                         "others": lg.comet_others, "log_dir": lg.log_dir}
        return cls(lg.log_dir, lg.tensorboard_dir, wandb_cfg, args.to_dict(), enabled=enabled,
                   comet_cfg=comet_cfg, start_iteration=start_iteration)

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
        numbers = dict(tracker_tag(k, v) for k, v in metrics.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool))
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        if self._comet is not None:
            self._comet.log_metrics(numbers, step=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._comet is not None:
            self._comet.end()  # offline: writes the archive and says where


# tracker -> (module it needs, its extra in requirements/, what asks for it, how to stop asking)
OPTIONAL_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard", "tensorboard_dir is set", "unset tensorboard_dir"),
    "wandb": ("wandb", "wandb", "use_wandb is on", "set use_wandb: false"),
    "comet": ("comet_ml", "comet", "use_comet is on", "set use_comet: false"),
}


def not_installed(tracker: str) -> RuntimeError:
    """The error for a configured tracker whose package is missing, with the install command."""
    module, extra, asked, off = OPTIONAL_PACKAGES[tracker]
    return RuntimeError(f"{asked} but {module} is not installed: pip install -r "
                        f"requirements/requirements-{extra}.txt, or {off}")


def check_trackers_installed(args) -> None:
    """RuntimeError naming the first tracker the config asks for whose package is missing (A7);
    deepy.py runs it before starting workers."""
    import importlib.util

    lg = args.logging
    asked = {"tensorboard": bool(lg.tensorboard_dir), "comet": bool(lg.use_comet),
             "wandb": bool(lg.use_wandb)}  # null: on only where wandb is installed
    for tracker, on in asked.items():
        if on and importlib.util.find_spec(OPTIONAL_PACKAGES[tracker][0]) is None:
            raise not_installed(tracker)


def _open_tensorboard(tensorboard_dir: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise not_installed("tensorboard") from None
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
        raise not_installed("wandb") from None
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


def _open_comet(cfg: dict, run_config: dict):
    """A Comet experiment as GPT-NeoX starts it (workspace, project, name, tags, `others`, the
    run config as parameters); offline into `<log_dir>/comet` when no API key reaches this
    worker and COMET_START_ONLINE does not decide."""
    # unless asked for: no framework auto-logging (it patches torch, and works only when
    # imported before it; the metrics are logged here), no error reports sent to Comet
    os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
    os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
    try:
        import comet_ml
        from comet_ml.config import get_api_key, get_config
    except ImportError:
        raise not_installed("comet") from None
    config = get_config()
    directory = _comet_offline_directory(config, cfg.get("log_dir"))
    online = None  # comet's own settings decide (COMET_START_ONLINE, ~/.comet.config)
    if config.get_bool(None, "comet.start.online") is None and not get_api_key(None, config):
        log.warning("use_comet is on but no Comet API key reached this worker (COMET_API_KEY "
                    "unset, none in ~/.comet.config): logging offline to %s; upload later with "
                    "`comet upload %s/<archive>.zip`", directory, directory)
        online = False
    experiment = comet_ml.start(
        workspace=cfg.get("workspace"), project=cfg.get("project"), online=online,
        experiment_config=comet_ml.ExperimentConfig(
            auto_output_logging=False,  # as GPT-NeoX: the console is not captured
            parse_args=False,  # the worker's command line is the encoded config, logged below
            # no closing summary of every parameter unless COMET_DISPLAY_SUMMARY_LEVEL asks
            display_summary_level=config.get_int(None, "comet.display_summary_level", default=0),
            name=cfg.get("name"), tags=cfg.get("tags"), offline_directory=directory))
    experiment.log_parameters(run_config)
    if cfg.get("others"):
        experiment.log_others(cfg["others"])
    return experiment


def _comet_offline_directory(config, log_dir: str | None) -> str:
    """Where an offline experiment's archive goes: the directory Comet's own settings name
    (COMET_OFFLINE_DIRECTORY, ~/.comet.config), else `<log_dir>/comet`, else Comet's default."""
    from comet_ml.config import DEFAULT_OFFLINE_DATA_DIRECTORY

    configured = os.path.expanduser(config["comet.offline_directory"])
    if log_dir and configured == DEFAULT_OFFLINE_DATA_DIRECTORY:
        return str(Path(log_dir) / "comet")
    return configured
