"""`NeoXArgs`: the whole run config as typed sections, plus derived values, loaded and validated.

    args = NeoXArgs.from_ymls(["configs/125M.yml", "configs/local_setup.yml"], ["train_iters=10"])
    args.model.hidden_size == args.hidden_size          # sections, or flat GPT-NeoX names
    args.derived.data_parallel_size                     # computed, never written by users
    worker_args = NeoXArgs.decode(args.encode()).with_world_size(int(os.environ["WORLD_SIZE"]))

Objects are immutable; `replace(**keys)` and `with_world_size(n)` return new validated ones.
Equality compares what the user wrote (after merging), so a saved YAML reloads to an equal object.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import difflib
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import yaml

from . import load
from .derived import DERIVED_NAMES, Derived, compute_derived
from .errors import ConfigError
from .sections import (
    FIELD_SECTION, CheckpointArgs, DataArgs, DeepSpeedArgs, EvalArgs, LauncherArgs,
    LoggingArgs, LRScheduleArgs, ModelArgs, OptimizerArgs, ParallelismArgs, SECTIONS,
    TextGenerationArgs, TokenizerArgs, TrainingArgs,
)
from .validate import validate

_ENCODING_VERSION = 1
Overrides = Iterable[str] | Mapping[str, Any] | None


@dataclass(frozen=True)
class NeoXArgs:
    """A validated run config: thirteen sections of user values and the derived values."""

    model: ModelArgs
    parallelism: ParallelismArgs
    optimizer: OptimizerArgs
    lr_schedule: LRScheduleArgs
    training: TrainingArgs
    data: DataArgs
    tokenizer: TokenizerArgs
    checkpoint: CheckpointArgs
    logging: LoggingArgs
    text_generation: TextGenerationArgs
    eval: EvalArgs
    launcher: LauncherArgs
    deepspeed: DeepSpeedArgs
    derived: Derived = field(compare=False, repr=False)
    overrides_log: tuple[str, ...] = field(default=(), compare=False, repr=False)
    world_size_override: int | None = field(default=None, compare=False, repr=False)
    # key path -> the file or command-line override that set it (load.Resolved.origins)
    origins: Mapping[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_ymls(
        cls,
        paths: str | os.PathLike | Iterable[str | os.PathLike],
        overrides: Overrides = None,
        *,
        world_size: int | None = None,
    ) -> NeoXArgs:
        """Load YAML files (merged left to right) and then overrides; validate and derive.

        world_size defaults to num_nodes * num_gpus (null and -1 count as 1).
        """
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        layers = load.file_layers(paths)
        values, texts = load.parse_overrides(overrides)
        layers.append((load.COMMAND_LINE, values))
        return cls._from_layers(layers, world_size, texts=texts)

    @classmethod
    def from_dict(
        cls, values: Mapping[str, Any], source: str = "<dict>", *, world_size: int | None = None
    ) -> NeoXArgs:
        """Build from flat key -> value pairs (like a config file); `source` names them."""
        return cls._from_layers([(source, dict(values))], world_size)

    @classmethod
    def from_yml_saved(cls, path: str | os.PathLike) -> NeoXArgs:
        """Reload a config written by `save_yml` (e.g. the one beside a checkpoint)."""
        return cls.from_ymls([path])

    @classmethod
    def _from_layers(
        cls, layers: list, world_size: int | None, log: tuple[str, ...] = (),
        texts: Mapping[str, str] | None = None,
        origins: Mapping[str, str | None] | None = None,
    ) -> NeoXArgs:
        resolved = load.resolve(layers, (load.COMMAND_LINE, load.REPLACED), texts, origins)
        sections = load.build_sections(resolved.values)
        flat = _flat(sections)
        if world_size is not None and (
            isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
        ):
            raise ConfigError(f"world_size({world_size!r}) must be an integer of at least 1.")
        validate(flat, world_size, resolved.origins)
        return cls(
            **sections,
            derived=compute_derived(flat, world_size),
            overrides_log=tuple(log) + tuple(resolved.log),
            world_size_override=world_size,
            origins=resolved.origins,
        )

    def replace(self, world_size: int | None = None, **values: Any) -> NeoXArgs:
        """A new validated config with these flat keys changed (for `world_size` ranks when
        given, else the same world size rule)."""
        layers = [(load.CURRENT, self.to_dict()), (load.REPLACED, values)]
        world = self.world_size_override if world_size is None else world_size
        return self._from_layers(layers, world, self.overrides_log, origins=self.origins)

    def with_world_size(self, world_size: int) -> NeoXArgs:
        """This config validated and derived for `world_size` ranks (workers pass $WORLD_SIZE)."""
        layers = [(load.CURRENT, self.to_dict())]
        return self._from_layers(layers, world_size, self.overrides_log, origins=self.origins)

    # ---- reading -----------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: flat GPT-NeoX names, then derived names.
        if name.startswith("__") or "derived" not in self.__dict__:
            raise AttributeError(name)
        section = FIELD_SECTION.get(name)
        if section is not None:
            return getattr(self.__dict__[section], name)
        if name in DERIVED_NAMES:
            return getattr(self.__dict__["derived"], name)
        close = difflib.get_close_matches(name, list(FIELD_SECTION) + list(DERIVED_NAMES), n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise AttributeError(f"NeoXArgs has no config key or derived value '{name}'.{hint}")

    def get(self, key: str) -> Any:
        """The user value of flat key `key` (use it for keys that share a section's name:
        `args.get("optimizer")` is the {type, params} dict, `args.optimizer` the section)."""
        key = key.replace("-", "_")
        if key not in FIELD_SECTION:
            raise KeyError(f"'{key}' is not a config key")
        return getattr(getattr(self, FIELD_SECTION[key]), key)

    @property
    def lr(self) -> float:
        """Peak learning rate (optimizer.params.lr)."""
        return self.optimizer.lr

    @property
    def betas(self) -> tuple[float, float]:
        """Adam betas (optimizer.params.betas)."""
        return self.optimizer.betas

    @property
    def eps(self) -> float:
        """Adam epsilon (optimizer.params.eps)."""
        return self.optimizer.eps

    @property
    def zero_stage(self) -> int:
        """ZeRO stage (zero_optimization.stage)."""
        return self.derived.zero_stage

    # ---- writing -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every user field as flat key -> value (merged, before derivation); plain YAML data."""
        return copy.deepcopy(_flat({name: getattr(self, name) for name in SECTIONS}))

    def to_yaml(self) -> str:
        """The resolved config as YAML, grouped by section; it reloads to an equal object."""
        parts = [
            "# Resolved config written by megatron.neox_arguments; reload it with "
            "NeoXArgs.from_yml_saved(path).\n"
        ]
        for name in SECTIONS:
            values = dataclasses.asdict(getattr(self, name))
            parts.append(f"\n# --- {name} ---\n")
            parts.append(
                yaml.dump(values, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                          width=100)
            )
        return "".join(parts)

    def save_yml(self, path: str | os.PathLike) -> None:
        """Write `to_yaml()` to path atomically (temporary file, then rename)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.to_yaml())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def encode(self) -> str:
        """The config as a compact ASCII string (zlib + urlsafe base64 of JSON) for argv."""
        payload = {
            "version": _ENCODING_VERSION,
            "config": self.to_dict(),
            "world_size": self.world_size_override,
        }
        raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> NeoXArgs:
        """The config `encode()` produced (validated again)."""
        try:
            payload = json.loads(zlib.decompress(base64.urlsafe_b64decode(text.encode("ascii"))))
        except (ValueError, zlib.error, UnicodeError) as e:
            raise ConfigError(
                f"Cannot decode the config string given to this process ({e}); pass the exact "
                "output of NeoXArgs.encode()."
            ) from None
        if payload.get("version") != _ENCODING_VERSION:
            raise ConfigError(
                f"The encoded config has version {payload.get('version')!r}, this code reads "
                f"version {_ENCODING_VERSION}; launch workers with the same code as the launcher."
            )
        return cls.from_dict(
            payload["config"], source="encoded config", world_size=payload["world_size"]
        )


class _Dumper(yaml.SafeDumper):
    """Safe YAML with short lists on one line and strings holding newlines double-quoted."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = '"' if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def _flat(sections: Mapping[str, Any]) -> dict[str, Any]:
    """Flat key -> value over all sections (no copies)."""
    flat: dict[str, Any] = {}
    for section in sections.values():
        for f in dataclasses.fields(section):
            flat[f.name] = getattr(section, f.name)
    return flat
