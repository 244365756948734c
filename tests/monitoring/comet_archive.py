"""Reading what a Comet offline experiment recorded: the archive `experiment.end()` writes holds
`experiment.json` (project, workspace, tags) and `messages.json` (one JSON message a line)."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CometArchive:
    """One offline experiment: its header, `others`, parameters and metrics by name."""

    experiment: dict
    others: dict = field(default_factory=dict)
    parameters: dict = field(default_factory=dict)
    metrics: dict[str, dict[int, float]] = field(default_factory=dict)  # name -> step -> value


def read_comet_archive(directory: Path) -> CometArchive:
    """The single archive in `directory` (AssertionError when there is none or several)."""
    archives = sorted(directory.glob("*.zip"))
    assert len(archives) == 1, f"expected one Comet archive in {directory}: {archives}"
    with zipfile.ZipFile(archives[0]) as z:
        out = CometArchive(json.loads(z.read("experiment.json")))
        lines = z.read("messages.json").decode().splitlines()
    for message in map(json.loads, lines):
        payload = message["payload"]
        if message["type"] == "log_other":
            out.others[payload["key"]] = payload["value"]
        elif message["type"] == "parameter_msg":  # "params" for list values
            param = payload.get("param") or payload["params"]
            out.parameters[param["paramName"]] = param["paramValue"]
        elif message["type"] == "metric_msg":
            metric = payload["metric"]
            out.metrics.setdefault(metric["metricName"], {})[metric["step"]] = metric["metricValue"]
    return out
