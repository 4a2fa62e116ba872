"""FedAsync: asynchronous federated optimisation (Xie et al. 2019, Algorithm 1 and §5.2).

Each time the server receives a model ``x_new`` that a client trained from
the version ``tau`` updates old, it mixes it into the current model:

    α_t = α s(t - tau),        x_t = (1 - α_t) x_{t-1} + α_t x_new

With ``u' = x_{t-1} - x_new`` (the update measured against the current
model, ``update_base="current"``) this is ``x_t = x_{t-1} - α s u'``: server
SGD with learning rate α on the staleness-weighted update. The server
receives one update per event (the asynchronous server's ``buffer_size`` 1);
with ``K > 1`` the K mixings are averaged. The paper's experiments use
α in {0.6, 0.9}, polynomial ``a = 0.5`` and hinge ``a = 10, b = 4`` (§6).
Its client adds a proximal term ``ρ/2 ||x - x_start||²`` (FedAsync's
regularised local objective, Eq. 2), traced as ``rho`` (0: plain SGD).

>>> sorted(fedasync().hyper())
['alpha', 'client_lr', 'rho']
"""

from __future__ import annotations

import jax
import optax

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.loss_terms import squared_distance
from fedjax_het.algorithms.optimizers import HyperOptimizer
from fedjax_het.algorithms.staleness import staleness_fn, staleness_weighted_mean
from fedjax_het.engine.algorithm import FederatedAlgorithm, model_loss
from fedjax_het.engine.hooks import UpdateBase, attach
from fedjax_het.engine.hyper import NON_NEGATIVE, HyperSpec, Interval

MIXING = Interval(0.0, 1.0, closed_low=False)  # α in (0, 1]


def fedasync(
    *, alpha: float = 0.6, client_lr: float = 0.05, rho: float = 0.0,
    staleness: str = "polynomial", a: float = 0.5, b: float = 4.0,
) -> FederatedAlgorithm:
    """FedAsync's client and server; run it with an asynchronous server of ``buffer_size = 1``.

    Args:
      alpha: the mixing weight α in (0, 1] (traced ``alpha``).
      client_lr: local SGD learning rate (traced ``client_lr``).
      rho: the proximal weight ρ >= 0 of the local objective (traced ``rho``).
      staleness, a, b: the staleness function ``s`` (``algorithms.staleness``).

    References:
      Xie, Koyejo and Gupta, "Asynchronous Federated Optimization" (arXiv:1903.03934, 2019),
      Algorithm 1 and §5.2.
    """
    mixing = HyperOptimizer(
        build=lambda hyper: optax.sgd(hyper["alpha"]),
        hyper=HyperSpec((("alpha", float(alpha)),), (("alpha", MIXING),)),
    )

    def local_loss(model, params, batch, ctx, hyper, key) -> jax.Array:
        drift = squared_distance(params, ctx.start)
        return model_loss(model, params, batch, ctx, hyper, key) + 0.5 * hyper["rho"] * drift

    algorithm = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=mixing,
        local_loss=local_loss,
        aggregator=staleness_weighted_mean(staleness_fn(staleness, a=a, b=b)),
        extra_hyper=(("rho", float(rho)),),
        hyper_ranges=(("rho", NON_NEGATIVE),),
        name="fedasync",
    )
    return attach(algorithm, UpdateBase("current"))
