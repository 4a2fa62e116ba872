"""fedjax_het: cross-device federated learning simulation, one vectorised JAX program per round."""

from fedjax_het import data, models, registry
from fedjax_het.algorithm import Aggregator, FederatedAlgorithm, weighted_mean
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.sampler import Sampler
from fedjax_het.simulate import History, run
from fedjax_het.sweep import sweep

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
