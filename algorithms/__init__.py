"""Federated learning algorithms, one module each (``fedjax_het.algorithms``)."""

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.agnostic_fedavg import agnostic_fedavg
from fedjax_het.algorithms.apfl import apfl
from fedjax_het.algorithms.biasprompt import biasprompt_plus
from fedjax_het.algorithms.ditto import ditto
from fedjax_het.algorithms.fedasync import fedasync
from fedjax_het.algorithms.fedavg import fedadagrad, fedadam, fedavg, fedavgm, fedyogi
from fedjax_het.algorithms.fedbuff import fedbuff
from fedjax_het.algorithms.feddyn import feddyn
from fedjax_het.algorithms.fedkd import fedkd
from fedjax_het.algorithms.fednova import fednova
from fedjax_het.algorithms.fedprox import fedprox
from fedjax_het.algorithms.fedrolex import fedrolex
from fedjax_het.algorithms.fetchsgd import fetchsgd
from fedjax_het.algorithms.fjord import fjord
from fedjax_het.algorithms.freezefl import freezefl
from fedjax_het.algorithms.heterofl import heterofl
from fedjax_het.algorithms.ifca import ifca
from fedjax_het.algorithms.mime import mime, mimelite
from fedjax_het.algorithms.personal_layers import fedper, fedrep
from fedjax_het.algorithms.qffl import qffl
from fedjax_het.algorithms.scaffold import scaffold
from fedjax_het.algorithms.timelyfl import timelyfl

__all__ = [
    "agnostic_fedavg",
    "apfl",
    "biasprompt_plus",
    "ditto",
    "fedadagrad",
    "fedadam",
    "fedasync",
    "fedavg",
    "fedavgm",
    "fedbuff",
    "feddyn",
    "fedkd",
    "fednova",
    "fedper",
    "fedprox",
    "fedrep",
    "fedrolex",
    "fedyogi",
    "fetchsgd",
    "fjord",
    "freezefl",
    "heterofl",
    "ifca",
    "mime",
    "mimelite",
    "optimizers",
    "qffl",
    "scaffold",
    "timelyfl",
]
