"""Every key this project shares with GPT-NeoX has GPT-NeoX's default, read from GPT-NeoX's
source (data/gpt-neox-defaults.json, written by data/gpt_neox_defaults.py), unless
docs/gpt-neox.md lists it among the deliberate differences; that page's tables state the code."""

from __future__ import annotations

import dataclasses
import json
import re

import yaml

from neox_args_helpers import DATA, REPO

from megatron.neox_arguments.neox_keys import NEOX_DEFAULTS, same_value
from megatron.neox_arguments.sections import SECTIONS

NEOX = json.loads((DATA / "gpt-neox-defaults.json").read_text())
PAGE = REPO / "docs/gpt-neox.md"


def our_defaults() -> dict:
    found = {}
    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                found[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                found[f.name] = f.default_factory()
            else:
                found[f.name] = "<required>"
    return found


def tables() -> list[list[list[str]]]:
    """The rows of each table in gpt-neox.md's Defaults section, cells split on unescaped |."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Defaults"):]
    section = section[:section.index("\n## ", 1)]
    found, rows = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            found.append(rows[2:])  # past the header and its rule
            rows = []
    return found


def literals(cell: str) -> list:
    """The values a cell writes in backticks: '`null`, `false`' -> [None, False]."""
    return [yaml.safe_load(v.replace("\\|", "|")) for v in re.findall(r"`([^`]*)`", cell)]


def keys(cell: str) -> list[str]:
    return re.findall(r"`(\w+)`", cell)


def test_every_shared_key_has_gpt_neoxs_default_or_is_a_documented_difference():
    ours = our_defaults()
    shared = set(ours) & set(NEOX)
    assert len(shared) >= 190, "the recorded defaults do not look like GPT-NeoX's"
    differ = {k for k in shared if not same_value(ours[k], NEOX[k])}
    _, deliberate = tables()
    documented = {k for row in deliberate for k in keys(row[0])}
    assert differ == documented, (
        f"defaults that differ from GPT-NeoX's but are not in docs/gpt-neox.md's table of "
        f"deliberate differences: {sorted(differ - documented)}; listed there but equal: "
        f"{sorted(documented - differ)}")


def test_the_defaults_tables_state_the_code_and_gpt_neoxs_source():
    ours = our_defaults()
    equal, deliberate = tables()
    assert len(equal) >= 5 and len(deliberate) >= 5
    for row in equal:
        names, values = keys(row[0]), literals(row[1])
        assert len(names) == len(values), row
        for name, value in zip(names, values):
            assert same_value(ours[name], value), (name, ours[name], value)
            assert name not in NEOX or same_value(NEOX[name], value), (name, NEOX[name])
    for row in deliberate:
        (name,), here, theirs = keys(row[0]), literals(row[1]), literals(row[2])
        if here:  # a value in backticks (not a description)
            assert same_value(ours[name], here[0]), (name, ours[name], here)
        if theirs:
            assert same_value(NEOX[name], theirs[0]), (name, NEOX[name], theirs)


def test_keys_not_implemented_here_are_accepted_at_gpt_neoxs_default():
    """neox_keys.NEOX_DEFAULTS: the value each such key is accepted at (and nothing else)."""
    assert {k: v for k, v in NEOX_DEFAULTS.items() if not same_value(v, NEOX[k])} == {}
