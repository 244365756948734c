"""The typed config sections of `NeoXArgs`, one dataclass per concern, and the flat key index.

`SECTIONS` maps each attribute name of `NeoXArgs` to its section class; `FIELD_SECTION` maps each
flat YAML key to the section that holds it. A key lives in exactly one section.
"""

from __future__ import annotations

import dataclasses

from .checkpoint import CheckpointArgs
from .data import DataArgs, TokenizerArgs
from .deepspeed import DeepSpeedArgs
from .inference import EvalArgs, TextGenerationArgs
from .launcher import LauncherArgs
from .model import ModelArgs
from .monitoring import LoggingArgs
from .optimization import LRScheduleArgs, OptimizerArgs
from .parallelism import ParallelismArgs
from .training import TrainingArgs

SECTIONS: dict[str, type] = {
    "model": ModelArgs,
    "parallelism": ParallelismArgs,
    "optimizer": OptimizerArgs,
    "lr_schedule": LRScheduleArgs,
    "training": TrainingArgs,
    "data": DataArgs,
    "tokenizer": TokenizerArgs,
    "checkpoint": CheckpointArgs,
    "logging": LoggingArgs,
    "text_generation": TextGenerationArgs,
    "eval": EvalArgs,
    "launcher": LauncherArgs,
    "deepspeed": DeepSpeedArgs,
}


def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in index, f"{f.name} is declared in {index.get(f.name)} and {section}"
            index[f.name] = section
    return index


FIELD_SECTION: dict[str, str] = _index()

__all__ = [
    "SECTIONS", "FIELD_SECTION", "ModelArgs", "ParallelismArgs", "OptimizerArgs",
    "LRScheduleArgs", "TrainingArgs", "DataArgs", "TokenizerArgs", "CheckpointArgs",
    "LoggingArgs", "TextGenerationArgs", "EvalArgs", "LauncherArgs", "DeepSpeedArgs",
]
