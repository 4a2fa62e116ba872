"""Federated learning algorithms, one module each (``fedjax_het.algorithms``)."""

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedadagrad, fedadam, fedavg, fedavgm, fedyogi
from fedjax_het.algorithms.fednova import fednova
from fedjax_het.algorithms.fedprox import fedprox

__all__ = ["fedadagrad", "fedadam", "fedavg", "fedavgm", "fednova", "fedprox", "fedyogi", "optimizers"]
