"""Looking algorithms and samplers up by name, for configs and the command line.

The engine never imports ``fedjax_het.algorithms`` or ``fedjax_het.sampling``
(docs/design.md §2): they announce their factories as package entry points
(groups ``fedjax_het.algorithms``, ``fedjax_het.samplers``,
``fedjax_het.device_samplers``, ``fedjax_het.state_samplers`` and
``fedjax_het.selections`` in ``pyproject.toml``), and third-party packages
can add their own the same way.
``register`` adds one for the current process, e.g. from a notebook.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

GROUPS = {
    "algorithm": "fedjax_het.algorithms",
    "sampler": "fedjax_het.samplers",
    "device_sampler": "fedjax_het.device_samplers",  # (speeds, *, num_clients, level, seed) -> rows
    "state_sampler": "fedjax_het.state_samplers",  # (trace scores, *, ...) -> trace rows
    "selection": "fedjax_het.selections",  # (num_clients, num_slots, **options) -> LearnedSelect
}
_registered: dict[str, dict[str, Callable]] = {kind: {} for kind in GROUPS}


def register(kind: str, name: str, factory: Callable) -> None:
    """Makes ``factory`` available as ``name`` in configs (``kind``: "algorithm" or "sampler")."""
    _registered[kind][name] = factory


@functools.cache
def _installed(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group``, by name: read once per process (a scan of every
    installed package's metadata, most of a config check's time otherwise)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def names(kind: str) -> list[str]:
    """Every registered name of ``kind``."""
    return sorted(set(_installed(GROUPS[kind])) | set(_registered[kind]))


def lookup(kind: str, name: str) -> Callable:
    """The factory registered as ``name``; a clear error naming the choices otherwise."""
    if name in _registered[kind]:
        return _registered[kind][name]
    if name in _installed(GROUPS[kind]):
        return _installed(GROUPS[kind])[name].load()
    known = names(kind)
    hint = difflib.get_close_matches(name, known, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ValueError(f"unknown {kind} {name!r}{suggestion}; known: {', '.join(known)}")
