"""Reading config files and overrides into one flat set of typed user values.

Steps: read each YAML file (GPT-NeoX's JSON-style files with comments and trailing commas are
YAML) -> spell keys canonically (dashes become underscores; renamed GPT-NeoX keys are accepted
with a warning; GPT-NeoX-only keys set to GPT-NeoX's default are dropped, as they change
nothing) -> refuse unknown keys and other GPT-NeoX-only values -> merge left to right, a later
source replacing a key's whole value (recorded with both sources) -> apply overrides ("key=value"
strings parsed as YAML, or a dict; "optimizer.params.lr=0.001" sets inside a mapping) -> check
every value against its field's type. Defaults are filled in by the section dataclasses.

Where each value was last set is kept by key path (`Resolved.origins`): a file's path, or
"command-line override `key=value`" as it was written; value errors name it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import yaml

from ..monitoring.logger import get_logger
from .errors import ConfigError, ConfigFileNotFoundError
from .fields import TypeMismatch, coerce, describe, field_types
from .neox_keys import (
    NOT_YET_IMPLEMENTED, RENAMED, RUNTIME_KEYS, default_clause, is_neox_default,
    not_implemented_reason, show,
)
from .registries import CANONICALISED_KEYS, REGISTRIES
from .sections import FIELD_SECTION, SECTIONS

log = get_logger(__name__)

COMMAND_LINE = "command line"
CURRENT = "current config"  # NeoXArgs.replace / with_world_size: the config being changed
REPLACED = "replace()"  # NeoXArgs.replace: values the code sets, not the user
FIELD_TYPES: dict[str, Any] = {
    name: tp for cls in SECTIONS.values() for name, tp in field_types(cls).items()
}
FIELD_DEFAULTS: dict[str, Any] = {
    f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
    for cls in SECTIONS.values() for f in dataclasses.fields(cls)
}
MAPPING_KEYS = frozenset(k for k, tp in FIELD_TYPES.items() if "mapping" in describe(tp))


@dataclass
class Resolved:
    """The keys a user set (canonical name -> typed value), where each came from, and the log.

    `sources` names the source of each key as the log does ("command line"); `origins` holds,
    by key path ("optimizer", "optimizer.params.lr"), where errors say the value was set: a
    file, "command-line override `key=value`", or None for a value the code set.
    """

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str | None] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    changed: dict[str, list[str]] = field(default_factory=dict)  # source -> keys it changed


class _Loader(yaml.SafeLoader):
    """YAML safe loader that refuses a key repeated inside one mapping."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"key {key!r} appears twice (first on line {seen[key]})", key_node.start_mark,
            )
        if isinstance(key, (str, int, float, bool)):
            seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yml(path: str | os.PathLike) -> dict[str, Any]:
    """The top-level mapping of one config file; `ConfigError` naming the file (and line)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        hint = (" It reads as a key=value override, which this command does not take: put it "
                "in a YAML file and pass that" if "=" in os.path.basename(path) else "")
        raise ConfigFileNotFoundError(
            f"Config file not found: {path} (relative paths start at {os.getcwd()}).{hint}"
        )
    if os.path.isdir(path):
        raise ConfigError(f"Config path {path} is a directory; give a .yml file.")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        # in a {...} mapping (this project's configs, GPT-NeoX's) a missing comma is the usual
        hint = (" (entries of a {...} mapping are separated by commas)"
                if "flow" in str(e) or "expected ','" in str(e) else "")
        raise ConfigError(
            f"{path}{line}: YAML syntax error: {problem}. Fix the file there{hint}."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of config keys (key: value), not a {type(data).__name__}."
        )
    return data


def parse_overrides(
    overrides: Iterable[str] | Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Overrides as (key -> value, key -> the override as written): "key=value" strings have
    their value parsed as YAML; a dict's items are written key=<JSON value>."""
    if overrides is None:
        return {}, {}
    if isinstance(overrides, Mapping):
        return dict(overrides), {k: f"{k}={show(v)}" for k, v in overrides.items()}
    if isinstance(overrides, str):
        overrides = [overrides]
    parsed: dict[str, Any] = {}
    texts: dict[str, str] = {}
    for item in overrides:
        key, sep, text = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"Override '{item}' must look like key=value, e.g. train_iters=100."
            )
        try:
            parsed[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"Override '{item}': the value is not valid YAML ({e}).") from None
        texts[key.strip()] = f"{key.strip()}={text.strip()}"
    return parsed, texts


def _nearest(key: str) -> str:
    names = list(FIELD_TYPES) + list(RENAMED)
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    if close:  # only names about as close as the closest (hiden_size: not batch_size)
        best = difflib.SequenceMatcher(None, key, close[0]).ratio()
        close = [c for c in close if difflib.SequenceMatcher(None, key, c).ratio() >= best - 0.1]
    if close:
        return f"Did you mean: {', '.join(close)}?"
    return "No valid key is close to it; every key is listed in configs/README.md."


def canonical_key(raw: Any, value: Any, source: str) -> str | None:
    """The field a written key sets; None for a GPT-NeoX-only key at its default (a no-op)."""
    if not isinstance(raw, str):
        raise ConfigError(f"Config key {raw!r} in {source} is not a string.")
    key = raw.strip().replace("-", "_")
    if key in RENAMED:
        log.warning(
            "%s: '%s' is GPT-NeoX's old name for '%s'; it is read as '%s' (rename it).",
            source, raw, RENAMED[key], RENAMED[key],
        )
        key = RENAMED[key]
    if key in FIELD_TYPES:
        return key
    if is_neox_default(key, value):
        return None  # a GPT-NeoX-only key at GPT-NeoX's default changes nothing
    if key in RUNTIME_KEYS:
        where = RUNTIME_KEYS[key]
        todo = (f"Set {where[len('read from '):].split(',')[0]}={json.dumps(value)} instead"
                if where.startswith("read from ") else "Remove it")
        raise ConfigError(
            f"'{raw}' in {source} is not a config option here: it is {where}; "
            f"{default_clause(key, value)}. {todo}."
        )
    if key in NOT_YET_IMPLEMENTED:
        raise ConfigError(f"{source}: {not_implemented_reason(key, value)}.")
    raise ConfigError(f"Unknown config key '{raw}' in {source}. {_nearest(key)}")


def _set_nested(base: Any, path: list[str], value: Any, raw: str, source: str) -> dict:
    if not isinstance(base, dict):
        raise ConfigError(f"'{raw}' in {source}: {path[0]} is not a mapping, so it has no keys.")
    result = copy.deepcopy(base)
    node = result
    for part in path[1:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"'{raw}' in {source}: {part} is not a mapping, so it has no keys.")
    node[path[-1]] = value
    return result


def _origin(source: str, raw: str, texts: Mapping[str, str]) -> str | None:
    """Where errors say `source` set the key written `raw`; None for the code's own values."""
    if source == REPLACED:
        return None
    if source == COMMAND_LINE:
        return f"command-line override `{texts.get(raw, raw)}`"
    return source


def _record_origin(origins: dict[str, str | None], path: str, origin: str | None) -> None:
    for inner in [p for p in origins if p.startswith(path + ".")]:
        del origins[inner]  # the value at `path` was replaced whole, what was set inside too
    origins[path] = origin


def origins_of(origins: Mapping[str, str | None], path: str) -> list[str]:
    """Every place that set part of the value at `path`: where the value (or a mapping above
    it) was last set, then where keys inside it were set afterwards, each once."""
    found = [origin_of(origins, path)]
    found += [o for p, o in origins.items() if p.startswith(path + ".")]
    return [o for o in dict.fromkeys(found) if o]


def origin_of(origins: Mapping[str, str | None], path: str) -> str | None:
    """Where the value at key path `path` ("optimizer.params.lr") was last set: its own entry,
    else that of the nearest mapping above it; None when not known or set by the code."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in origins:
            return origins[prefix]
    return None


def merge_layer(
    resolved: Resolved, source: str, values: Mapping[str, Any], log_defaults: bool = False,
    texts: Mapping[str, str] | None = None,
) -> None:
    """Apply one source's keys on top of `resolved`. A key set again is recorded with both
    sources, and counted among the source's changes when its value changes; with log_defaults
    (command-line overrides), a key replacing its default is too. `texts` holds the
    command-line overrides as typed (parse_overrides), which errors quote."""
    written: dict[str, str] = {}
    for raw, value in values.items():
        head, *rest = raw.split(".") if isinstance(raw, str) else (raw,)
        written_value = value
        for part in reversed(rest):  # "amp.enabled=false" writes amp: {enabled: false}
            written_value = {part: written_value}
        where = (_origin(source, raw, texts or {}) if isinstance(raw, str) else None) or source
        key = canonical_key(head, written_value, where)
        if key is None:
            continue
        if rest:
            if key not in MAPPING_KEYS:
                raise ConfigError(
                    f"'{raw}' in {where}: {key} is not a mapping, so it has no keys."
                )
            base = resolved.values.get(key, FIELD_DEFAULTS[key])
            value = _set_nested(base if base is not None else {}, [key, *rest], value, raw, where)
        elif key in written:
            raise ConfigError(
                f"{source} sets '{key}' twice (as '{written[key]}' and '{raw}'); keep one."
            )
        written[key] = raw
        if key in resolved.values or log_defaults:
            old, old_source = (
                (resolved.values[key], resolved.sources[key]) if key in resolved.values
                else (FIELD_DEFAULTS[key], "default")
            )
            line = f"{key}: {show(old)} ({old_source}) -> {show(value)} ({source})"
            resolved.log.append(line)  # logged at debug level by deepy.py (log_overrides)
            # the same value again changes nothing, and the code's own changes (a tool's flag
            # or a step of the run) are said by the code: kept in the record, not summed up
            if show(old) != show(value) and source != REPLACED:
                resolved.changed.setdefault(source, []).append(key)
        resolved.values[key] = value
        resolved.sources[key] = source
        if source != CURRENT:  # the config being changed keeps the origins it had
            path = ".".join([key, *rest])
            _record_origin(resolved.origins, path, _origin(source, raw, texts or {}))


def log_overrides(record: Iterable[str]) -> None:
    """Each value a config file or the command line changed (NeoXArgs.overrides_log), at debug
    level: called once the config's own log_level is in force."""
    for line in record:
        log.debug("config override %s", line)


def _typed(key: str, value: Any, source: str) -> Any:
    """`value` in the type of field `key`; `source` is where the error says it was set."""
    try:
        value = coerce(value, FIELD_TYPES[key])
    except TypeMismatch as e:
        hint = ""
        if isinstance(value, int) and not isinstance(value, bool) and "str" in e.expected:
            hint = (" Quote it if it is text: YAML reads unquoted digits as a number, and digits "
                    "with colons as base 60 (98:2 is 5882)"
                    + ("; split takes comma-separated proportions, e.g. 98,2" if key == "split"
                       else "") + ".")
        raise ConfigError(
            f"'{key}' in {source} must be {e.expected}, but it is {show(value)} "
            f"({type(value).__name__}).{hint}"
        ) from None
    if key == "optimizer":
        value = _normalise_optimizer(value)
    if key in CANONICALISED_KEYS and isinstance(value, str):
        value = REGISTRIES[key].canonical(value) or value
    return value


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _normalise_optimizer(opt: dict) -> dict:
    """Numeric strings in optimizer.params become floats; the type gets its registered spelling."""
    opt = copy.deepcopy(opt)
    if isinstance(opt.get("type"), str):
        opt["type"] = REGISTRIES["optimizer.type"].canonical(opt["type"]) or opt["type"]
    params = opt.get("params")
    if isinstance(params, dict):
        for k in ("lr", "eps", "weight_decay", "momentum"):
            if k in params:
                params[k] = _number(params[k])
        if isinstance(params.get("betas"), list):
            params["betas"] = [_number(b) for b in params["betas"]]
    return opt


def resolve(
    layers: Iterable[tuple[str, Mapping[str, Any]]], log_defaults_from: Iterable[str] = (),
    texts: Mapping[str, str] | None = None, origins: Mapping[str, str | None] | None = None,
) -> Resolved:
    """Merge (source, values) layers left to right and type every value that was set; every key
    of a source named in log_defaults_from is logged, even when it only replaces a default.
    `texts`: the command-line overrides as typed; `origins`: those of the config a CURRENT
    layer holds (`Resolved.origins`)."""
    resolved = Resolved(origins=dict(origins or {}))
    log_sources = set(log_defaults_from)
    for source, values in layers:
        merge_layer(resolved, source, values, source in log_sources, texts)
    for source, keys in resolved.changed.items():  # one line per source; each value at debug
        log.info("config: %s %s %s (log_level: debug lists each value)", source,
                 "sets" if source == COMMAND_LINE else "overrides", ", ".join(keys))
    resolved.values = {
        k: _typed(k, v, origin_of(resolved.origins, k) or resolved.sources[k])
        for k, v in resolved.values.items()
    }
    return resolved


def file_layers(paths: Iterable[str | os.PathLike]) -> list[tuple[str, dict[str, Any]]]:
    """(path, mapping) for each config file, read in order."""
    return [(os.fspath(p), read_yml(p)) for p in paths]


def build_sections(values: Mapping[str, Any]) -> dict[str, Any]:
    """Section name -> section dataclass, from the typed values a user set (defaults elsewhere)."""
    grouped: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for key, value in values.items():
        grouped[FIELD_SECTION[key]][key] = value
    return {name: SECTIONS[name](**grouped[name]) for name in SECTIONS}
