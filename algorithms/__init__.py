"""Federated learning algorithms, one module each (``fedjax_het.algorithms``)."""

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedadagrad, fedadam, fedavg, fedavgm, fedyogi

__all__ = ["fedadagrad", "fedadam", "fedavg", "fedavgm", "fedyogi", "optimizers"]
