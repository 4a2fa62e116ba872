"""Modules that moved in the layout of docs/design.md §2, importable under their old names
for one release with a ``DeprecationWarning`` (``import fedjax_het.cohort`` gives
``fedjax_het.engine.cohort``, the same module object)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "sampler": "system.sampler",
    "algorithm": "engine.algorithm",
    "local": "engine.local",
    "client_store": "engine.client_store",
    "cohort": "engine.cohort",
    "round": "engine.round",
    "memory": "engine.memory",
    "compression": "transforms.compression",
    "privacy": "transforms.privacy",
    "simulate": "training.simulate",
    "online": "training.online",
    "checkpoint": "training.checkpoint",
    "interrupt": "training.interrupt",
    "divergence": "training.divergence",
    "metrics": "training.metrics",
    "compilation": "training.compilation",
    "distributed": "training.distributed",
    "mediator": "gandalf.mediator",
    "gan": "gandalf.gan",
    "rebalance": "gandalf.rebalance",
}


def moved_module(old: str) -> ModuleType:
    """The module ``fedjax_het.<old>`` now is, with a warning naming its new place."""
    new = f"fedjax_het.{MOVED[old]}"
    warnings.warn(
        f"fedjax_het.{old} moved to {new}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return importlib.import_module(new)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``fedjax_het.<old>`` for each moved module and loads it as the new module."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package != "fedjax_het" or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return moved_module(spec.name.rpartition(".")[2])

    def exec_module(self, module):
        pass


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
