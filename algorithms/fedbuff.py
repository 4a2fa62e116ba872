"""FedBuff: buffered asynchronous aggregation (Nguyen et al. 2022, AISTATS, Algorithm 1).

Clients train asynchronously from the model version they downloaded; the
server buffers their updates and, once it holds ``K`` (the asynchronous
server's ``buffer_size``), applies

    Δ̄ = (1/K) Σ_k s(tau_k) Δ_k,        x ← x - η_g Δ̄

with ``s(tau) = 1 / sqrt(1 + tau)`` (§5; ``algorithms.staleness``) and
``Δ_k = y_start - y_trained`` the client's own delta, measured from the
model it started from. The buffering, the concurrency and the staleness
bound belong to the server (``fedjax_het.system.events.async_server``:
FLHetBench used concurrency 100, K = 20, tau <= 5, notes §4.5); this module is
the client and server arithmetic. ``weighting="uniform"`` in the run gives
the paper's ``1/K``; example weighting gives ``Σ n_k s_k Δ_k / Σ n_k``.

FLHetBench's released FedBuff replaces the model by the staleness-weighted
average of client *models* instead (notes §5.7); ``staleness="polynomial"``
with ``update_base="current"`` and ``server_lr = 1`` is that rule up to the
normalisation (ours divides by ``K``, theirs by ``Σ s``).

>>> sorted(fedbuff().hyper())
['client_lr', 'server_lr']
"""

from __future__ import annotations

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.staleness import staleness_fn, staleness_weighted_mean
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.hooks import UpdateBase, attach


def fedbuff(
    *, client_lr: float = 0.05, server_lr: float = 1.0, server_momentum: float | None = None,
    staleness: str = "polynomial", a: float = 0.5, b: float = 4.0, update_base: str = "start",
) -> FederatedAlgorithm:
    """FedBuff's client and server; run it with an asynchronous server (``[server] mode = "async"``).

    Args:
      client_lr: local SGD learning rate (traced ``client_lr``).
      server_lr: η_g (traced ``server_lr``).
      server_momentum: server heavy-ball momentum (traced ``server_momentum``), or None
        (the paper's plain step; FLHetBench's momentum variant uses 0.9).
      staleness, a, b: the staleness weight (``algorithms.staleness``); the default
        is the paper's ``1 / sqrt(1 + tau)``.
      update_base: "start" (the paper: each client's own delta) or "current".

    References:
      Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek and Huba, "Federated Learning with
      Buffered Asynchronous Aggregation" (AISTATS 2022), Algorithm 1.
    """
    algorithm = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr, momentum=server_momentum),
        aggregator=staleness_weighted_mean(staleness_fn(staleness, a=a, b=b)),
        name="fedbuff",
    )
    return algorithm if update_base == "start" else attach(algorithm, UpdateBase(update_base))
