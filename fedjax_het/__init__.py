"""fedjax_het: cross-device federated learning simulation, one vectorised JAX program per round."""

from fedjax_het import _moved, data, models, registry
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.engine.algorithm import Aggregator, FederatedAlgorithm, weighted_mean
from fedjax_het.sweep import sweep
from fedjax_het.system.sampler import Sampler
from fedjax_het.training.recorder import History
from fedjax_het.training.simulate import run

__all__ = [
    "Aggregator",
    "FederatedAlgorithm",
    "FederatedData",
    "History",
    "LocalWork",
    "Sampler",
    "data",
    "models",
    "registry",
    "run",
    "sweep",
    "weighted_mean",
]
__version__ = "0.1.0"

_moved.install()


def __getattr__(name: str):
    """``fedjax_het.<old module>`` for the modules that moved (docs/design.md §2), warned."""
    if name in _moved.MOVED:
        return _moved.moved_module(name)
    raise AttributeError(f"module 'fedjax_het' has no attribute {name!r}")
