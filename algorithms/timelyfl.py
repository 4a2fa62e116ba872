"""TimelyFL: partial training that fits each client into the aggregation interval.

Zhang, Gao, Lee, Zhang and Avestimehr, "TimelyFL: Heterogeneity-aware
Asynchronous Federated Learning with Adaptive Partial Training" (CVPR
Workshops 2023), as FLHetBench runs it (notes: flhetbench-notes §5.8, §4.6).
Each selected client trains only the last layers of the model, its first
layers frozen, as few frozen as let it finish inside the aggregation
interval ``T``. With ``tau_k(d)`` client k's expected round time when its
first ``d`` of the ``L`` layers are frozen (``d = 0`` trains everything), it
trains at depth

    d_k = min {d : tau_k(d) <= T},  or  L - 1 (only the last layer) if none fits,

and uploads only the layers it trained. The server averages each coordinate
over the clients that trained it, weighted by ``|D_k|``
(``algorithm.masked_mean``): ``Δ = Σ_k w_k m_k Δ_k / Σ_k w_k m_k``.

The choice needs no probe (``Freezing.probe_share = 0``): it depends only on
the client's profile. The engine (``fedjax_het.training.online``) prices every depth
at the client's mean speeds (download, the steps at the FLOPs XLA counts for
the layers still training, the upload of those layers), applies the mask
from the first step, and schedules the round with each client's upload bytes.
A layer is a top-level module of the params, in definition order
(``freezefl.depth_masks``). Use a deadline policy whose deadline is ``T``:
a client that does not fit even at the deepest freeze is then late.

.. warning:: Deliberate deviations, where the notes are silent or the
   engine's interface decides:

   * ``T`` is the traced hyperparameter ``interval`` (seconds), fixed over
     the run. The paper sets it from the k-th fastest client's full-model
     round time, which ``Freezing.choose`` cannot see (it receives only its
     own client's times); FLHetBench's rule is the round deadline, which a
     run gets with ``interval`` equal to the policy's deadline. The server's
     soft deadline is not used: it is the mean finish time of clients that
     already fit the interval, so as the interval it would shrink every round.
   * FLHetBench freezes the first ``1 - ratio`` of the parameters, ``ratio``
     = available time / full-model time, tensor by tensor; here each depth
     is priced and the unit is a layer.
   * FLHetBench also averages in the old global model (as its FedAvg does,
     notes §8 item 14), which shrinks each coordinate's step by ``n / (n + 1)``
     for ``n`` trainers; here it is not, as in this package's FedAvg and FreezeFL.
   * Rounds are synchronous; only the partial training the notes describe is
     implemented.

>>> import jax.numpy as jnp
>>> least_frozen_fitting(jnp.array([9.0, 5.0, 2.0]), jnp.float32(6.0)).item()
1
>>> least_frozen_fitting(jnp.array([9.0, 8.0, 7.0]), jnp.float32(6.0)).item()  # none fits
2
>>> timelyfl(interval=30.0).hyper()["interval"].item()
30.0
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.freezefl import depth_masks
from fedjax_het.engine.algorithm import FederatedAlgorithm, masked_mean
from fedjax_het.engine.hooks import Freezing, attach
from fedjax_het.engine.hyper import POSITIVE
from fedjax_het.typing import Hyper, Update


def least_frozen_fitting(seconds: jax.Array, interval: jax.Array) -> jax.Array:
    """The smallest depth ``d`` with ``seconds[d] <= interval``; the deepest, ``D - 1``, if none."""
    fits = seconds <= interval
    return jnp.where(jnp.any(fits), jnp.argmax(fits), seconds.shape[0] - 1).astype(jnp.int32)


def choose_depth(
    update: Update, seconds: jax.Array, soft_deadline: jax.Array, hyper: Hyper
) -> jax.Array:
    """``Freezing.choose`` of TimelyFL: ``least_frozen_fitting`` at ``hyper["interval"]``."""
    del update, soft_deadline
    return least_frozen_fitting(seconds, hyper["interval"])


def timelyfl(
    *, interval: float = 120.0, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """TimelyFL with aggregation interval ``interval`` seconds (traced; > 0).

    The default 120 s is FLHetBench's round deadline (notes §4.2), the default
    deadline of ``system.setup.policy_from_options``.

    Args:
      interval: T, the aggregation interval in seconds (traced), > 0: each client freezes
        the fewest first layers that let it finish within it.
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Zhang, Gao, Lee, Zhang and Avestimehr, "TimelyFL: Heterogeneity-aware Asynchronous
      Federated Learning with Adaptive Partial Training" (CVPR Workshops 2023).
    """
    algorithm = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=masked_mean(),
        extra_hyper=(("interval", float(interval)),),
        hyper_ranges=(("interval", POSITIVE),),
        name="timelyfl",
    )
    return attach(algorithm, Freezing(0.0, depth_masks, choose_depth))
