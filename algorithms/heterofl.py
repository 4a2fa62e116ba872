"""HeteroFL: each client trains a fixed width-scaled sub-model of one global model.

Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients" (ICLR 2021), §3.1-3.2. A client of computation level
``r`` (ratio ``p_r``, e.g. ``1, 1/2, 1/4, 1/8, 1/16``) trains the sub-model ``W^{p_r}``:
the leading ``ceil(p_r d)`` units of every hidden layer of ``d`` units (input and output
sizes kept). The server averages each parameter over the clients that hold it (Eq. 2-3):

    W[j] = Σ_{k : j ∈ W^{p_k}} n_k W_k[j] / Σ_{k : j ∈ W^{p_k}} n_k.

**Scaler** (§3.2): a hidden layer's output is divided by ``p_r`` in training (identity at
evaluation), so that a sub-model's activations keep the full model's scale; here the
fan-in rows that read masked units are scaled instead (``algorithms/submodels.py``: the
same function for ReLU and max-pool). **Static batch normalisation** (§3.2) does not apply:
the shipped models have no normalisation layers (a model with BatchNorm statistics is
refused by ``models.from_linen``/``from_nnx``).

>>> algorithm = heterofl(widths=(1.0, 0.5), client_levels=(0, 1))
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr']

References:
  Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated
  Learning for Heterogeneous Clients" (ICLR 2021), §3.

.. warning:: Decisions where the paper is silent: with ``client_levels`` empty, client ``k``
   gets level ``k mod L`` (the paper's "fix" split in equal shares); the global model is
   evaluated at full width only; on the simulated schedule a client's step costs its
   width's share of the forward FLOPs and its transfers its sub-model's bytes both ways
   (``submodels.level_flops``, ``level_counts``).
"""

from __future__ import annotations

from fedjax_het.algorithms.width_fedavg import width_fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm

DEFAULT_WIDTHS = (1.0, 0.5, 0.25, 0.125, 0.0625)


def heterofl(
    *, widths: tuple[float, ...] = DEFAULT_WIDTHS, client_levels: tuple[int, ...] = (),
    width_from: str = "uniform",
    client_lr: float = 0.05, server_lr: float = 1.0,
    dense_groups: bool = True,
) -> FederatedAlgorithm:
    """HeteroFL with fixed per-client widths and the scaler.

    Args:
      widths: the computation levels' ratios in (0, 1], strictly decreasing (the paper's
        ``a..e = 1, 1/2, 1/4, 1/8, 1/16``).
      client_levels: each client's level as an index of ``widths``, one per client of the
        population; empty: client ``k`` gets level ``k mod L``.
      width_from: with ``client_levels`` empty, "uniform" (client ``k`` gets level
        ``k mod L``) or "speed" (from the [system]'s step times, the fastest ``1 / L`` of
        the clients widest: ``submodels.levels_by_speed``; needs a [system]).
      client_lr, server_lr: the clients' and the server's SGD learning rates (traced).
      dense_groups: train each width level's clients as one dense program of the cut model
        (``engine.groups``: about the work the widths do, the results of masks within float
        rounding) where the engine can (a model with ``at_width``, one device, no train
        masks; one program per level to compile, about twice the masks' compile time);
        False: masks on the full model (every client costs full width in wall time).

    References:
      Diao, Ding and Tarokh, "HeteroFL" (ICLR 2021), §3.
    """
    return width_fedavg(
        "heterofl", widths, ordered_dropout=False, rolling=False, scaler=True,
        client_levels=client_levels, width_from=width_from, client_lr=client_lr,
        server_lr=server_lr, dense_groups=dense_groups,
    )
