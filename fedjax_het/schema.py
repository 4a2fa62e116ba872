"""Checking a config table against the code it feeds: the machinery every table's schema uses.

A config table is the keyword arguments of one function (``arguments``) or the fields of one
dataclass (``construct``): a key it does not take is unknown, a value is converted to the
parameter's type hint or refused (``check``), and the error is a :class:`ConfigError` of one
line that names the key and what is allowed. The tables themselves live beside the code they
configure (``fedjax_het.data.schema``, ``fedjax_het.system.schema``, ...); ``fedjax_het.front.config``
assembles them.

No number may be NaN or infinite, except where a table says what ``inf`` means (its
``UNBOUNDED``); integers fit in 32 bits; seeds are >= 0.

A key that does nothing where it is set is refused as an unknown one is: a table declares
where each of its kind-dependent keys acts (``When``: ``policy.deadline`` where ``policy.kind =
"deadline"``, in its ``APPLIES``) and ``applies`` checks every key the user set against them.

Every key is a :class:`Key`: its type, default and what it means. A table that lists its keys
writes their descriptions itself; a key read off a function's signature or a dataclass's fields
takes its description from that docstring's ``Args:`` / ``Attributes:`` /
``Hyperparameters:`` / ``Options:`` entry (or its module docstring's) and its paper from the
``References:`` section (``documented``), so that ``fedjax-het explain`` and the checks read one
schema.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedjax_het import registry

INT_BITS = 32  # integer options must fit JAX's default int32


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is allowed."""


class Key(NamedTuple):
    """One config key: its type, default and what it means (what ``fedjax-het explain`` says)."""

    hint: Any  # the type its value is checked against (``check``)
    default: Any  # ``...``: required; None: unset unless given
    doc: str = ""  # what it does
    paper: str = ""  # the paper it comes from, where one applies
    minimum: int | None = None  # the least value it may take (``within``), where one applies
    choices: tuple[str, ...] = ()  # the values it may take, where they are a few names
    allowed: str = ""  # the values it may take, in words, where neither of those says it

    def limits(self) -> str:
        """The values this key may take beyond its type, in words ("" when only its type says)."""
        if self.choices:
            return either(self.choices)
        return self.allowed or ("" if self.minimum is None else f">= {self.minimum}")


def either(names: Sequence[str]) -> str:
    """``'a' or 'b'``, or ``one of 'a', 'b', 'c'``."""
    quoted = [repr(n) for n in names]
    return " or ".join(quoted) if len(quoted) <= 2 else f"one of {', '.join(quoted)}"


def within(key: str, value: Any, spec: Key) -> None:
    """Raises a ConfigError when a checked ``value`` is not among ``spec.choices`` or below
    ``spec.minimum``."""
    if spec.choices and value not in spec.choices:
        raise ConfigError(f"{key} must be {either(spec.choices)}, got {value!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"{key} must be >= {spec.minimum}, got {value}")


class When(NamedTuple):
    """Where a key does something: the key ``chooser`` takes one of ``values`` (``"*.csv"``: a
    CSV path), or with ``unless``, anything but them (``applies``)."""

    chooser: str
    values: tuple[Any, ...]
    unless: bool = False

    def holds(self, value: Any) -> bool:
        """Whether ``value`` of the chooser lets the key act."""
        csv = isinstance(value, str) and value.lower().endswith(".csv")
        hit = any(value == v or (v == "*.csv" and csv) for v in self.values)
        return hit != self.unless

    def describe(self) -> str:
        """``policy.kind = 'deadline'``, ``system.device_sampler is not 'random'``..."""
        names = [toml_value(v) if v != "*.csv" else "a CSV path" for v in self.values]
        joined = names[0] if len(names) == 1 else f"one of {', '.join(names)}"
        return f"{self.chooser} {'is not' if self.unless else '='} {joined}"


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it: ``true``, ``'deadline'``, ``0.5``."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def applies(
    config: Mapping[str, Any],
    given: Mapping[str, Sequence[str]],
    rules: Mapping[str, Sequence[When]],
    defaults: Mapping[str, Any],
) -> None:
    """Raises a ConfigError for the first key the user set (``given``: table -> keys) that does
    nothing in ``config`` (resolved: its choosers hold the values the run uses, else
    ``defaults``): a key of ``rules`` one of whose conditions fails. A key that does nothing
    is refused as an unknown one is, since a run that ignores it is not the run asked for;
    one set to its default asks for nothing (a resolved config, ``config --all``, lists them
    all) and passes."""
    for key, conditions in rules.items():
        table, _, leaf = key.partition(".")
        value = (config.get(table) or {}).get(leaf)
        if leaf not in given.get(table, ()) or value == defaults.get(key):
            continue
        for when in conditions:
            chooser_table, _, chooser = when.chooser.partition(".")
            chosen = (config.get(chooser_table) or {}).get(chooser, defaults.get(when.chooser))
            if not when.holds(chosen):
                raise ConfigError(
                    f"{key} does nothing here: it applies only where {when.describe()}, and "
                    f"this config has {when.chooser} = {toml_value(chosen)}; remove it"
                )


_ENTRY_SECTIONS = ("Args", "Attributes", "Hyperparameters", "Options")
_ENTRY = re.compile(r"(\w+(?:, \w+)*)(?: \([^)]*\))?: (.*)")


@functools.cache
def documented(obj: Callable) -> tuple[dict[str, str], str]:
    """``({name: description}, references)`` read from ``obj``'s docstring, and then from its
    module's (a module may describe what its functions share: their hyperparameters, their
    options, their paper).

    The entries of the ``Args:``, ``Attributes:``, ``Hyperparameters:`` and ``Options:``
    sections (Google style: ``name: text``, continued on more-indented lines; ``a, b: text``
    describes both) and the text of the ``References:`` section.
    """
    entries, references = _sections(inspect.getdoc(obj) or "")
    module = inspect.getmodule(obj)
    shared, module_references = _sections((module and inspect.getdoc(module)) or "")
    return {**shared, **entries}, references or module_references


def _sections(doc: str) -> tuple[dict[str, str], str]:
    """The entries and references of one docstring (``documented``)."""
    entries: dict[str, str] = {}
    references: list[str] = []
    section, names, indent = "", [], 0
    for line in doc.splitlines():
        text, depth = line.strip(), len(line) - len(line.lstrip())
        if depth == 0 and text:
            section, names, indent = (text[:-1] if text.endswith(":") else ""), [], 0
        elif section == "References" and text:
            references.append(text)
        elif section in _ENTRY_SECTIONS and text:
            indent = indent or depth
            entry = _ENTRY.fullmatch(text) if depth == indent else None
            if entry:
                names = entry[1].split(", ")
                entries.update(dict.fromkeys(names, entry[2]))
            else:
                entries.update({name: f"{entries[name]} {text}" for name in names})
    return entries, " ".join(references)


def configurable(fn: Callable, skip: Sequence[str] = ()) -> dict[str, Any]:
    """``{name: default}`` of ``fn``'s parameters a config table may set (no default: ``...``)."""
    out = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in skip or p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        if p.default is p.empty:
            out[name] = ...
        elif isinstance(p.default, (bool, int, float, str, list, tuple)):
            out[name] = list(p.default) if isinstance(p.default, tuple) else p.default
    return out


def signature_keys(table: str, fn: Callable, skip: Sequence[str] = ()) -> dict[str, Key]:
    """``{"table.key": Key}`` for each configurable parameter of ``fn`` (a table's schema),
    described by ``fn``'s docstring."""
    hints = typing.get_type_hints(fn)
    docs, paper = documented(fn)
    return {
        f"{table}.{k}": Key(hints.get(k, Any), default, docs.get(k, ""), paper)
        for k, default in configurable(fn, skip).items()
    }


def dataclass_keys(table: str, cls: type) -> dict[str, Key]:
    """``{"table.key": Key}`` for each field of the dataclass ``cls``, described by its
    docstring's ``Attributes:``."""
    docs, paper = documented(cls)
    defaults = {
        f.name: ... if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }
    return {
        f"{table}.{k}": Key(hint, defaults[k], docs.get(k, ""), paper)
        for k, hint in typing.get_type_hints(cls).items()
    }


def arguments(
    table: str,
    fn: Callable,
    values: Mapping[str, Any],
    skip: Sequence[str] = (),
    unbounded: Mapping[str, str] = types.MappingProxyType({}),
) -> dict:
    """Checks ``values`` against ``fn``'s configurable keyword parameters and their type hints.

    Configurable parameters are those whose default is a TOML value (number,
    string, bool, list) or that have no default. ``unbounded`` says, by key,
    what ``inf`` means where it is allowed. Returns the checked values.
    """
    params = configurable(fn, skip)
    hints = typing.get_type_hints(fn)
    out = {}
    for key, value in values.items():
        if key not in params:
            raise ConfigError(unknown("key", f"{table}.{key}", {f"{table}.{k}": 0 for k in params}))
        out[key] = check(f"{table}.{key}", value, hints.get(key, Any), unbounded)
    missing = [k for k, default in params.items() if default is ... and k not in out]
    if missing:
        raise ConfigError(f"{table}.{missing[0]} is required here and has no default")
    return out


def resolved(table: Mapping[str, Any], fn: Callable, skip: Sequence[str] = ()) -> dict[str, Any]:
    """``table`` with every configurable default of ``fn`` filled in, for the run's record."""
    defaults = {k: v for k, v in configurable(fn, skip).items() if v is not ...}
    return {**defaults, **table}


def optional_table(config: dict[str, Any], name: str, fn: Callable) -> dict[str, Any] | None:
    """An optional table checked against ``fn``'s signature: its values, with ``fn``'s defaults
    filled in the run's record; None (and the table dropped) when it is empty."""
    table = dict(config.get(name) or {})
    if not table:
        config.pop(name, None)
        return None
    args = arguments(name, fn, table)
    config[name] = resolved(args, fn)
    return args


def construct(table: str, cls: type, values: Mapping[str, Any]):
    """The dataclass ``cls`` built from ``values``, each checked against its field's type."""
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in values:
        if key not in fields:
            raise ConfigError(unknown("key", f"{table}.{key}", {f"{table}.{k}": 0 for k in fields}))
    checked = {k: check(f"{table}.{k}", v, hints[k]) for k, v in values.items()}
    return guarded(table, lambda: cls(**checked))


def guarded(table: str, make: Callable[[], Any]) -> Any:
    """Runs a constructor, turning its ValueError into a ConfigError that names the table."""
    try:
        return make()
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"[{table}] {err}") from None


def registered(kind: str, name: Any) -> Callable:
    """The factory registered under ``name`` (``fedjax_het.registry``)."""
    known = registry.names(kind)
    if not isinstance(name, str) or name not in known:
        raise ConfigError(unknown(f"{kind}.name", name, dict.fromkeys(known)))
    return registry.lookup(kind, name)


def choose(key: str, name: Any, choices: Mapping[str, Any]) -> Any:
    """``choices[name]``, the value a choosing key (``data.name``, ``partition.kind``) names."""
    if name is None:
        raise ConfigError(f"{key} is required here (it chooses the table's options); allowed: "
                          f"{', '.join(sorted(choices))}")
    if not isinstance(name, str) or name not in choices:
        raise ConfigError(unknown(key, name, choices))
    return choices[name]


def check(
    key: str, value: Any, hint: Any, unbounded: Mapping[str, str] = types.MappingProxyType({})
) -> Any:
    """``value`` converted to ``hint`` (int, float, bool, str, sequences, optionals) or a
    ConfigError; a float may be ``inf`` only where ``unbounded`` says what it means for ``key``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        # The option of the value's own kind first, so that its error is the one reported.
        options.sort(key=lambda option: _is_sequence(option) != isinstance(value, (list, tuple)))
        errors = []
        for option in options:
            try:
                return check(key, value, option, unbounded)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key} has an unsupported type")
    if hint is float:
        return _number(key, value, unbounded)
    if hint is int:
        return _integer(key, value)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if _is_sequence(hint):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return [check(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)] if args else value
    return value


def representable(config: Mapping[str, Any], precision: str) -> None:
    """Raises a ConfigError for a float option of a resolved ``config`` that is finite in
    Python but not in the run's precision: float32 unless ``precision`` is "float64" (the
    ``engine.precision``), where ``1e308`` is ``inf``."""
    if precision == "float64":
        return
    largest = float(np.finfo(np.float32).max)
    for key, value in _floats(config):
        if math.isfinite(value) and abs(value) > largest:
            raise ConfigError(
                f"{key} = {value:g} is not finite in float32, the run's precision (largest "
                f'{largest:.4g}); engine.precision = "float64" runs in float64'
            )


def _floats(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(key, value)`` of every float in a config's tables, lists included (``key[i]``)."""
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from _floats(value, f"{prefix}{key}.")
        elif isinstance(value, (list, tuple)):
            yield from ((f"{prefix}{key}[{i}]", v) for i, v in enumerate(value) if type(v) is float)
        elif type(value) is float:
            yield f"{prefix}{key}", value


def _number(key: str, value: Any, unbounded: Mapping[str, str]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the largest float
        number = math.inf if value > 0 else -math.inf
    if math.isfinite(number) or (number == math.inf and key in unbounded):
        return number
    allowed = f" or inf ({unbounded[key]})" if key in unbounded else ""
    raise ConfigError(f"{key} must be a finite number{allowed}, got {number}")


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if not -(2 ** (INT_BITS - 1)) <= value < 2 ** (INT_BITS - 1):
        raise ConfigError(
            f"{key} must be an integer of {INT_BITS} bits (|value| < 2**{INT_BITS - 1}), "
            f"got {value}"
        )
    if key.rpartition(".")[2] == "seed" and value < 0:  # numpy refuses them, JAX wraps them
        raise ConfigError(f"{key} must be >= 0, got {value}")
    return value


def _is_sequence(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    return origin in (list, tuple, Sequence, typing.Sequence) or hint in (list, tuple)


def unknown(what: str, name: Any, choices: Mapping[str, Any]) -> str:
    """The one-line error for a name not among ``choices``, with the closest one suggested."""
    known = sorted(choices)
    hint = difflib.get_close_matches(str(name), known, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown {what} {name!r}{suggestion}; allowed: {', '.join(known)}"
