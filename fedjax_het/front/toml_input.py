"""Reading a config's TOML: a file (``read``), ``--set`` overrides (``parse_override``), and the
nesting a config may have (``shallow``); each error is one line naming the path or the key.
``fedjax_het.front.config.load`` merges what these read over the defaults."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedjax_het.schema import ConfigError

MAX_DEPTH = 16
"""The deepest a config nests tables and arrays (its own go 3 deep: ``[data]``, a list of
lists); deeper is refused before anything recurses through it."""


def shallow(raw: Mapping[str, Any]) -> None:
    """Raises a ConfigError naming the first key under which ``raw`` nests more than
    :data:`MAX_DEPTH` tables or arrays (walked without recursion)."""
    stack: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in raw.items()]
    while stack:
        key, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{key.split('.')[0]} nests tables or arrays more than {MAX_DEPTH} "
                              "deep; a config's tables and values nest a few levels at most")
        if isinstance(value, Mapping):
            stack += [(f"{key}.{k}", v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(key, v, depth + 1) for v in value]


def read(path: str | Path) -> dict[str, Any]:
    """The TOML tables of the config file ``path``.

    Raises:
      ConfigError: one line naming the path: it does not exist, is a folder or
        not a regular file, cannot be read, is not UTF-8 text, or is not valid
        TOML (with tomllib's line and column).
    """
    name = f"config file {str(path)!r}"
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{name} is a folder, not a TOML file")
    if file.exists() and not file.is_file():
        raise ConfigError(f"{name} is not a regular file")
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{name} does not exist") from None
    except OSError as err:
        raise ConfigError(f"{name} cannot be read: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{name} is not a text file (not UTF-8 at byte {err.start}); a config is TOML text"
        ) from None
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{name} is not valid TOML: its arrays or tables nest too deeply "
                          "for Python's parser") from None
    except tomllib.TOMLDecodeError as err:
        twice = _set_twice(text) if str(err).startswith("Cannot overwrite a value") else None
        reason = f"{twice[0]} is set twice (line {twice[1]})" if twice else str(err)
        raise ConfigError(f"{name} is not valid TOML: {reason}") from None


def _set_twice(text: str) -> tuple[str, int] | None:
    """The first key a TOML text sets twice in one table, and its second line (``tomllib``
    names only the line, or the end of the document)."""
    seen, table = set(), ""
    for number, line in enumerate(text.splitlines(), 1):
        header = re.fullmatch(r"\[([^\[\]]+)\]\s*(#.*)?", line.strip())
        assignment = re.match(r"\s*([\w.\-\"' ]+?)\s*=", line)
        if header:
            table = header[1].replace(" ", "") + "."
        elif assignment:
            key = table + re.sub(r"[\s\"']", "", assignment[1])
            if key in seen:
                return key, number
            seen.add(key)
    return None


def parse_override(item: str) -> tuple[str, Any]:
    """``"algorithm.client_lr=0.1"`` -> ``("algorithm.client_lr", 0.1)``; values are TOML."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. algorithm.client_lr=0.1), got {item!r}")
    if not all(part.strip() for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: {key.strip()!r} is not a key (names joined by single "
                          "dots, e.g. data.name)")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word is a string
    except RecursionError:
        raise ConfigError(f"--set {key.strip()}: the value nests too deeply") from None
    return key.strip(), value
