"""fedjax_het: cross-device federated learning simulation, one vectorised JAX program per round.

Its names are imported when first used (PEP 562), so that importing a part of the package
(the ``fedjax-het`` command's entry, ``fedjax_het.front.entry``) does not import JAX first.
"""

import importlib

_HOMES = {
    "data": "fedjax_het.data",
    "models": "fedjax_het.models",
    "registry": "fedjax_het.registry",
    "FederatedData": "fedjax_het.data",
    "LocalWork": "fedjax_het.data",
    "Aggregator": "fedjax_het.engine.algorithm",
    "FederatedAlgorithm": "fedjax_het.engine.algorithm",
    "weighted_mean": "fedjax_het.engine.algorithm",
    "sweep": "fedjax_het.front.sweep",
    "Sampler": "fedjax_het.system.sampler",
    "History": "fedjax_het.training.recorder",
    "Training": "fedjax_het.training.options",
    "Timing": "fedjax_het.training.options",
    "Engine": "fedjax_het.training.options",
    "Output": "fedjax_het.training.options",
    "run_options": "fedjax_het.training.options",
    "run": "fedjax_het.training.simulate",
}
"""Where each public name lives."""

__all__ = sorted(_HOMES)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'fedjax_het' has no attribute {name!r}")
    module = importlib.import_module(_HOMES[name])
    value = module if module.__name__ == f"fedjax_het.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
