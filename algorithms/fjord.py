"""FjORD: ordered dropout, each client training the nested sub-networks its device allows.

Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and Accurate
Federated Learning under heterogeneous targets with Ordered Dropout" (NeurIPS 2021), §3
and Algorithm 1. Ordered dropout keeps, for a ratio ``p``, the leading ``ceil(p K)`` of a
layer's ``K`` units (Eq. 1: ``F_p`` uses units ``0 .. ceil(p K) - 1``, so ``F_p ⊂ F_p'`` for
``p < p'``). Client ``k`` of maximum width ``p_max(k)`` draws, for each local step (each
batch), ``p ~ U(P_k)``, ``P_k = {p ∈ P : p <= p_max(k)}``, and takes the step on ``F_p``;
it uploads ``F_{p_max(k)}``, and the server averages each parameter over the clients
whose ``F_{p_max}`` holds it (§3.3, "Ordered Dropout Aggregation"):

    w_{t+1}[j] = Σ_{k : j ∈ F_{p_max(k)}} n_k w_k[j] / Σ_{k : j ∈ F_{p_max(k)}} n_k.

The sub-models are masks over the full params (``algorithms/submodels.py``): a step's
update is multiplied by its ``F_p`` mask, so nothing moves a unit the step dropped.

>>> algorithm = fjord(widths=(1.0, 0.6, 0.2), client_levels=(0, 1, 2))
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr']

Args (of ``fjord``):
  widths: P, the width ratios in (0, 1], strictly decreasing (the paper's
    ``{0.2, 0.4, 0.6, 0.8, 1.0}``, listed widest first).
  client_levels: each client's ``p_max`` as an index of ``widths``, one per client of the
    population; empty: client ``k`` gets ``widths[k mod |P|]`` (equal shares of the
    paper's uniform device tiers). ``submodels.levels_by_speed`` derives them from the
    clients' step times (faster devices wider).
  client_lr, server_lr: the clients' and the server's SGD learning rates (traced).

References:
  Horváth et al., "FjORD: Fair and Accurate Federated Learning under heterogeneous targets
  with Ordered Dropout" (NeurIPS 2021), Algorithm 1.

.. warning:: Decisions where the paper is silent: ``p`` is drawn per local step from the
   step's own key (stream "submodel"), reproducible and independent of chunking; the
   knowledge-distillation variant (§3.4) is not implemented; on the simulated schedule a
   client's step costs the mean FLOPs share over its allowed widths (the expectation of
   its draws), its transfers ``F_{p_max}``'s bytes both ways (the server sends the
   sub-model); its work kept (FreezeFL's selection, Table IV) is ``p_max``.
"""

from __future__ import annotations

from fedjax_het.algorithms.width_fedavg import width_fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm

DEFAULT_WIDTHS = (1.0, 0.8, 0.6, 0.4, 0.2)


def fjord(
    *, widths: tuple[float, ...] = DEFAULT_WIDTHS, client_levels: tuple[int, ...] = (),
    width_from: str = "uniform",
    client_lr: float = 0.05, server_lr: float = 1.0,
) -> FederatedAlgorithm:
    """FjORD (ordered dropout, ``p`` drawn per step from the client's allowed widths).

    Args:
      widths: P, widest first (see the module docstring).
      client_levels: each client's ``p_max`` as an index of ``widths``; empty: round-robin.
      width_from: with ``client_levels`` empty, "uniform" (client ``k`` gets level
        ``k mod L``) or "speed" (from the [system]'s step times, the fastest ``1 / L`` of
        the clients widest: ``submodels.levels_by_speed``; needs a [system]).
      client_lr, server_lr: the clients' and the server's learning rates (traced).

    References:
      Horváth et al., "FjORD" (NeurIPS 2021), Algorithm 1.
    """
    return width_fedavg(
        "fjord", widths, ordered_dropout=True, rolling=False, scaler=False,
        client_levels=client_levels, width_from=width_from, client_lr=client_lr,
        server_lr=server_lr,
    )
