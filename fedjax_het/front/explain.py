"""What every config option means: ``fedjax-het explain KEY`` and ``fedjax-het config --all``.

Both read the schema that checks a config (``config.options``): a key's type, default, allowed
values, description and paper are those of the :class:`~fedjax_het.schema.Key` its table
declares, or that its function's docstring gives. A key that only some choices take
(``algorithm.prox_mu``: FedProx) is found by trying every choice of the keys that choose a
table's other keys (:data:`CHOOSING`), as :func:`variants` does.
"""

from __future__ import annotations

import difflib
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from fedjax_het import results
from fedjax_het.front import config as config_lib
from fedjax_het.gandalf import schema as gandalf_schema
from fedjax_het.schema import ConfigError, Key

CHOOSING = (
    "data.name", "partition.kind", "feature_skew.kind", "model.name", "algorithm.name",
    "selection.name",
)  # fmt: skip
"""The keys whose value chooses the other keys of their table."""
OPTIONAL = ("feature_skew", "system", "policy", "selection", "server", "compression", "privacy",
            "logging", "distributed")  # fmt: skip
"""The tables a config may leave out; ``config --all`` writes them commented out."""


def variants(config: Mapping[str, Any] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(choice, merged config)``: ``config`` (default: the defaults) with choice "", then one
    config per value of each key of :data:`CHOOSING` (choice ``'algorithm.name = "fedprox"'``)."""
    base = config_lib.merge_defaults(config or {})
    yield "", base
    options = config_lib.options(base)
    for chooser in CHOOSING:
        for name in options[chooser].choices if chooser in options else ():
            table, _, leaf = chooser.partition(".")
            variant = config_lib.merge_defaults({**(config or {}), table: {leaf: name}})
            yield f"{chooser} = {_value(name)}", variant


def find(key: str, config: Mapping[str, Any] | None = None) -> list[tuple[str, Key]]:
    """``[(choice, Key)]``: ``key`` as ``config`` takes it (choice ""), else as each choice that
    takes it does; a ConfigError naming the closest key when no choice takes it."""
    found, every = [], {}
    for choice, variant in variants(config):
        options = config_lib.options(variant)
        if key in options and (not choice or key.startswith(choice.split(".")[0] + ".")):
            found.append((choice, options[key]))
            if not choice:
                return found
        every.update(options)
    if not found:
        hint = difflib.get_close_matches(key, every, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(
            f"unknown key {key!r}{suggestion}; fedjax-het config --all lists a config's keys"
        )
    return found


def explain(key: str, config: Mapping[str, Any] | None = None) -> str:
    """What ``fedjax-het explain KEY`` prints: ``key``'s description, type, allowed values,
    default and paper, in ``config`` (default: the default config) or in the choices that
    take it."""
    found = find(key, config)
    choice, spec = found[0]
    rows = [
        ("what", _plain(spec.doc) or "(undocumented)"),
        ("type", _type(key, spec.hint)),
        ("allowed", spec.limits()),
        ("default", _default(spec.default)),
        ("paper", spec.paper),
    ]
    if choice:
        also = [c.partition(" = ")[2] for c, _ in found[1:]]
        rows.append(("applies", f"with {choice}" + (f" (also {', '.join(also)})" if also else "")))
    lines = [key]
    for label, text in rows:
        if text:
            lines += textwrap.wrap(
                text, 100, initial_indent=f"  {label:<8} ", subsequent_indent=" " * 11
            )
    return "\n".join(lines) + "\n"


def _type(key: str, hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type(key, a) for a in typing.get_args(hint) if a is not type(None))
    if hint is float:
        meaning = config_lib.UNBOUNDED.get(key)
        return f"a finite number, or inf ({meaning})" if meaning else "a finite number"
    if hint is int:
        return f"an integer of {config_lib.INT_BITS} bits"
    names = {bool: "true or false", str: "a string"}
    if hint in names:
        return names[hint]
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    return f"a list, each {_type(key, args[0])}" if args else "a list"


def _default(value: Any) -> str:
    if value is ...:
        return "none: it must be given"
    return "unset" if value is None else _value(value)


def _value(value: Any) -> str:
    """``value`` written as TOML."""
    return results.to_toml({"v": value}).partition(" = ")[2].rstrip("\n")


def annotated(resolved: Mapping[str, Any]) -> str:
    """What ``fedjax-het config --all`` prints: the ``resolved`` config (``build``'s) with every
    option its tables take, each after its description in comments, and the optional tables it
    leaves out commented out: a TOML config to edit (uncomment a table by removing one ``# ``
    from each of its lines)."""
    options = config_lib.options(resolved)
    lines = [
        "# Every option of this config with the value it takes; optional tables are commented",
        "# out (remove one '# ' from each of a table's lines to use it). More on any key:",
        "# fedjax-het explain KEY",
        "",
        *_lines(options, "", resolved),
    ]
    for table, doc in config_lib.TABLES.items():
        if resolved.get(table):
            lines += ["", *_comment(doc), f"[{table}]", *_lines(options, table, resolved[table])]
        elif _applies(table, resolved):
            lines += ["", *_commented(table, doc, resolved)]
    return "\n".join(lines) + "\n"


def _applies(table: str, resolved: Mapping[str, Any]) -> bool:
    """Whether the optional ``table`` may be added to ``resolved`` as it stands."""
    if table == "feature_skew":
        return "partition" in resolved  # centralised data only
    mediated = gandalf_schema.is_mediated(resolved)
    return table in OPTIONAL and not (mediated and table in gandalf_schema.REFUSED)


def _commented(table: str, doc: str, resolved: Mapping[str, Any]) -> list[str]:
    """The optional ``table`` with its keys, commented out. A table whose key names a choice
    (``selection.name``) lists every choice with the keys it takes, grouped by choice: the
    first ready to uncomment, the others commented once more."""
    chooser = next((c for c in CHOOSING if c.startswith(f"{table}.")), None)
    if chooser is None:
        options = config_lib.options(resolved)
        block = [*_comment(f"optional: {doc}"), f"[{table}]", *_lines(options, table, {})]
        return [f"# {line}" for line in block]
    leaf = chooser.partition(".")[2]
    choices = config_lib.options(resolved)[chooser].choices
    said = f"optional: {doc}; {chooser} chooses its other keys: each choice below with its keys"
    block = [*_comment(said), f"[{table}]"]
    for i, name in enumerate(choices):
        values = {leaf: name}
        lines = _lines(config_lib.options({**resolved, table: values}), table, values)
        if i:  # the chooser's description once, above the first choice
            lines = ["or instead:", *lines[lines.index(f"{leaf} = {_value(name)}") :]]
            lines = ["", *(f"# {line}" for line in lines)]
        block += lines
    return [f"# {line}" for line in block]


def _lines(options: Mapping[str, Key], table: str, values: Mapping[str, Any]) -> list[str]:
    """The keys of ``table`` (``""``: the top-level keys), each as its description and
    allowed values in comments, then ``key = value`` with ``values``' value or else its
    default; a key without either is itself a comment."""
    prefix = f"{table}." if table else ""
    keys = {k.removeprefix(prefix): spec for k, spec in options.items() if k.startswith(prefix)}
    lines = []
    for leaf in dict.fromkeys([*values, *keys]):
        if "." in leaf or isinstance(values.get(leaf), Mapping):
            continue  # a key of another table
        spec = keys.get(leaf, Key(Any, None))
        notes = [_plain(spec.doc).rstrip("."), spec.limits() and f"allowed: {spec.limits()}"]
        comment = "; ".join(note for note in notes if note)
        lines += _comment(comment)
        value = values.get(leaf, spec.default)
        if value is None or value is ...:
            lines.append(f"# {leaf} = ({_type(prefix + leaf, spec.hint)}; {_default(value)})")
        else:
            lines.append(f"{leaf} = {_value(value)}")
    return lines


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, 98, initial_indent="# ", subsequent_indent="# ")


def _plain(doc: str) -> str:
    """A docstring's text without its reStructuredText literals' quotes."""
    return doc.replace("``", "")
