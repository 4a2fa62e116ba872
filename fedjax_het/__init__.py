"""fedjax_het: cross-device federated learning simulation, one vectorised JAX program per round."""

from fedjax_het import data, models, registry
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.engine.algorithm import Aggregator, FederatedAlgorithm, weighted_mean
from fedjax_het.front.sweep import sweep
from fedjax_het.system.sampler import Sampler
from fedjax_het.training.options import Engine, Output, Timing, Training, run_options
from fedjax_het.training.recorder import History
from fedjax_het.training.simulate import run

__all__ = [
    "Aggregator",
    "Engine",
    "FederatedAlgorithm",
    "FederatedData",
    "History",
    "LocalWork",
    "Output",
    "Sampler",
    "Timing",
    "Training",
    "data",
    "models",
    "registry",
    "run",
    "run_options",
    "sweep",
    "weighted_mean",
]
__version__ = "0.1.0"
