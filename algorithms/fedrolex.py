"""FedRolex: sub-models whose window of kept units rolls by one unit each round.

Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning with Rolling
Sub-Model Extraction" (NeurIPS 2022), §3, Eq. 3. In round ``r`` a client of ratio ``β_k``
trains, in every hidden layer of ``K`` units, the units

    S_{k,r} = { (r mod K) + i mod K : 0 <= i < ceil(β_k K) },

so every unit of the global model is trained by the narrow clients in turn; input and
output sizes are kept. The server averages each parameter over the clients that trained
it (as HeteroFL, Eq. 4).

>>> algorithm = fedrolex(widths=(1.0, 0.5), client_levels=(0, 1))
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr']

References:
  Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning with Rolling
  Sub-Model Extraction" (NeurIPS 2022), Eq. 3.

.. warning:: Decisions where the paper is silent or differs from its code: ``ceil(β K)``
   units (the paper writes ``⌊β K⌋``, which keeps no unit of a narrow layer) as HeteroFL
   does; the window advances forward (``torch.roll`` in the reference code moves it
   backward, the same schedule mirrored); the offset is the server's round count, which
   advances every round whoever trains; HeteroFL's scaler is on by default (the reference
   code builds on HeteroFL's models), ``scaler=False`` turns it off; on the simulated
   schedule a client costs what HeteroFL's of the same width does (the window's position
   does not change its size).
"""

from __future__ import annotations

from fedjax_het.algorithms.width_fedavg import width_fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm

DEFAULT_WIDTHS = (1.0, 0.5, 0.25, 0.125, 0.0625)


def fedrolex(
    *, widths: tuple[float, ...] = DEFAULT_WIDTHS, client_levels: tuple[int, ...] = (),
    width_from: str = "uniform",
    scaler: bool = True, client_lr: float = 0.05, server_lr: float = 1.0,
    dense_groups: bool = True,
) -> FederatedAlgorithm:
    """FedRolex with a window rolling one unit a round.

    Args:
      widths: the width ratios in (0, 1], strictly decreasing (the paper's
        ``1, 1/2, 1/4, 1/8, 1/16``).
      client_levels: each client's level as an index of ``widths``, one per client of the
        population; empty: client ``k`` gets level ``k mod L``.
      scaler: HeteroFL's scaler (activations times ``1 / β`` in training).
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
      Alam et al., "FedRolex" (NeurIPS 2022), Eq. 3.
    """
    return width_fedavg(
        "fedrolex", widths, ordered_dropout=False, rolling=True, scaler=scaler,
        client_levels=client_levels, width_from=width_from, client_lr=client_lr,
        server_lr=server_lr, dense_groups=dense_groups,
    )
