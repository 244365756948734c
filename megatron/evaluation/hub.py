"""Whether lm-eval's workers can reach the Hugging Face Hub, decided once in deepy.py.

Registry tasks read their datasets through the Hub. Where the Hub cannot be reached (a compute
node without internet), the Hub's client retries each request five times over about 30 s, in
every worker, printing two lines per try, before the dataset is found missing. So deepy.py
tries one TCP connection to the Hub (or to the proxy that reaches it) before the workers start,
and where none opens it starts them in the Hub's offline mode (HF_HUB_OFFLINE=1,
HF_DATASETS_OFFLINE=1) and says so in one line: cached datasets are read from the cache. A user
who sets either variable decides instead; nothing is tried then. Either way offline, a task
whose dataset the cache lacks is refused before the workers start (task_data.py); the
workers' own one line (fetch_failure) is left for what that check cannot see.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit
from urllib.request import proxy_bypass_environment

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_SECONDS = 3.0
PROXY_VARS = ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")  # as the Hub's client and the datasets library read them
PROBE_REUSE_SECONDS = 60.0
# (host, port) -> (when, unreachable's answer): deepy.py's pre-launch check and the launch itself
# ask within a second of each other, and one connection attempt answers both
_probes: dict[tuple[str, int], tuple[float, str | None]] = {}


def hub_endpoint(environ) -> str:
    return (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def route(endpoint: str, environ) -> tuple[str, int, str]:
    """(host, port, what) of the first connection a request to `endpoint` makes: the Hub's
    host, or the proxy that the environment routes it through."""
    host, port = _address(endpoint)
    proxy = next((environ[v] for v in PROXY_VARS if environ.get(v)), None)
    no_proxy = {k: environ[k] for k in ("no_proxy", "NO_PROXY") if environ.get(k)}
    if proxy and not (no_proxy and proxy_bypass_environment(host, {
            "no": next(iter(no_proxy.values()))})):
        proxy_host, proxy_port = _address(proxy)
        return proxy_host, proxy_port, f"the proxy {proxy_host}:{proxy_port} for {endpoint}"
    return host, port, endpoint


def unreachable(host: str, port: int, seconds: float = CONNECT_SECONDS) -> str | None:
    """Why no TCP connection to host:port opens within `seconds`, or None when one does."""
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return None
    except socket.gaierror as err:
        return f"cannot resolve {host}: {err.strerror or err}"
    except socket.timeout:
        return f"no answer from {host}:{port} within {seconds:g} s"
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err}"


def _probe(host: str, port: int) -> str | None:
    """unreachable(host, port), asked at most once a minute."""
    now = time.monotonic()
    seen = _probes.get((host, port))
    if seen is None or now - seen[0] > PROBE_REUSE_SECONDS:
        seen = _probes[(host, port)] = (now, unreachable(host, port))
    return seen[1]


def user_offline(environ) -> str:
    """The user's settings that put the Hub's client offline ('HF_HUB_OFFLINE=1'), or ''."""
    return ", ".join(f"{v}={environ[v]}" for v in OFFLINE_VARS
                     if str(environ.get(v, "")).upper() in TRUE_VALUES)


def offline_reason(environ) -> str | None:
    """Why lm-eval's workers will read datasets from the local cache only: the user's setting,
    or no connection to the Hub from here (offline_env then starts them offline); None when
    they may download."""
    if user_offline(environ):
        return user_offline(environ)
    if any(environ.get(v) for v in OFFLINE_VARS):
        return None  # the user chose the Hub
    host, port, what = route(hub_endpoint(environ), environ)
    why = _probe(host, port)
    return None if why is None else \
        f"the Hugging Face Hub cannot be reached from here: {what}: {why}"


def offline_env(eval_tasks, environ) -> dict[str, str]:
    """The variables that start the workers in the Hub's offline mode, when they run lm-eval
    tasks that may need the Hub (not only task files reading local data), the user has not
    chosen a mode, and the Hub cannot be reached from here; else {}."""
    from megatron.evaluation.tasks import reads_only_local_files

    if not eval_tasks or any(environ.get(v) for v in OFFLINE_VARS):
        return {}
    if reads_only_local_files(list(eval_tasks)):
        return {}
    host, port, what = route(hub_endpoint(environ), environ)
    why = _probe(host, port)
    if why is None:
        return {}
    log.warning("the Hugging Face Hub cannot be reached from here (%s: %s): the workers read "
                "lm-eval's task datasets from the local cache only (HF_HUB_OFFLINE=1, "
                "HF_DATASETS_OFFLINE=1; set HF_HUB_OFFLINE=0 to have them try the Hub anyway)",
                what, why)
    return {var: "1" for var in OFFLINE_VARS}


def fetch_failure(err: Exception, environ) -> str:
    """The one line for lm-eval's ConnectionError: a task's dataset could not be had."""
    if user_offline(environ):
        from huggingface_hub import constants

        return (f"a task's dataset is not in the local cache ({err}), and the workers run in "
                "the Hugging Face Hub's offline mode (HF_HUB_OFFLINE=1): fill the cache "
                f"({constants.HF_HOME}) where the Hub can be reached, e.g. by running this eval "
                "there once with the same HF_HOME, then run it here again")
    return (f"lm-eval could not fetch a task's dataset ({err}); registry tasks download from "
            f"the Hugging Face Hub ({hub_endpoint(environ)}) on first use: check the network, "
            "or fill the cache where the Hub can be reached and set HF_HUB_OFFLINE=1 here")
