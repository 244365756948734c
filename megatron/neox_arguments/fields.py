"""Declaring config fields (`option`) and checking a value against a field's type (`coerce`).

Every section field is declared with `option(default, doc)`: the doc is the one line shown in
`configs/README.md`. The loader calls `coerce(value, type)` on every value a user wrote: it returns
the value in the field's type or raises `TypeMismatch` naming the expected type. Conversions are
deliberately few: an int where a float is expected, a numeric string for a number (YAML reads
`6e-4` as a string), a float with no fractional part for an int.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from typing import Any


def option(default: Any, doc: str) -> Any:
    """A section field with its default and its one-line documentation."""
    metadata = {"doc": doc}
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=lambda: copy.deepcopy(default), metadata=metadata
        )
    return dataclasses.field(default=default, metadata=metadata)


class TypeMismatch(Exception):
    """A value that does not fit a field's type; `expected` says in words what would."""

    def __init__(self, expected: str):
        super().__init__(expected)
        self.expected = expected


def _union_args(tp: Any) -> tuple | None:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return typing.get_args(tp)
    return None


def describe(tp: Any) -> str:
    """The type in words, as users read it in errors and in configs/README.md."""
    args = _union_args(tp)
    if args is not None:
        names = [describe(a) for a in args if a is not type(None)]
        text = " or ".join(names)
        return text + " or null" if type(None) in args else text
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return "list" if item is Any else f"list of {describe(item)}"
    if tp is list:
        return "list"
    if tp is dict or origin is dict:
        return "mapping"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def check_plain_data(value: Any) -> Any:
    """`value` if it holds only YAML/JSON data (null, bool, numbers, str, lists, str-keyed maps)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [check_plain_data(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeMismatch("a mapping with string keys")
        return {k: check_plain_data(v) for k, v in value.items()}
    raise TypeMismatch("plain YAML data (null, booleans, numbers, strings, lists, mappings)")


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeMismatch("int")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                raise TypeMismatch("int") from None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise TypeMismatch("int")


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeMismatch("float")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise TypeMismatch("float")


def coerce(value: Any, tp: Any) -> Any:
    """`value` converted to type `tp`, or `TypeMismatch` saying what `tp` accepts."""
    args = _union_args(tp)
    if args is not None:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg)
            except TypeMismatch:
                continue
        raise TypeMismatch(describe(tp))
    if tp is Any:
        return check_plain_data(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeMismatch("bool (true or false)")
    if tp is int:
        return _to_int(value)
    if tp is float:
        return _to_float(value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise TypeMismatch("str")
    origin = typing.get_origin(tp)
    if tp is list or origin is list:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]  # one item where a list is expected: `--eval_tasks lambada_openai`
        if not isinstance(value, (list, tuple)):
            raise TypeMismatch(describe(tp))
        (item,) = typing.get_args(tp) or (Any,)
        try:
            return [coerce(v, item) for v in value]
        except TypeMismatch:
            raise TypeMismatch(describe(tp)) from None
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise TypeMismatch("mapping")
        return check_plain_data(value)
    raise AssertionError(f"unsupported field type {tp!r}")


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type annotations of a section dataclass, by field name."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def field_doc(f: dataclasses.Field) -> str:
    """The one-line doc given to `option` for this field."""
    return f.metadata["doc"]
