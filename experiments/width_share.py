"""What share of FedAvg's round a mixed-width round should cost: its widths' FLOP share.

The issue "Accelerator throughput II", item 3, holds a mixed-width HeteroFL round (Diao,
Ding and Tarokh 2021, §3.1: client ``k`` trains the sub-model of width ``w_k``) to at most
"its mean width's share of FedAvg's round plus 25 %". Read here as the round's share of
FedAvg's work: the mean over the cohort's clients of each client's width's share of the
full model's forward FLOPs (``algorithms.submodels.width_costs``, what the simulated
schedule charges a client of that width; the backward pass shrinks as the forward does),

    share = (1 / m) Σ_k F(w_k) / F(1),      limit = SLACK x share, SLACK = 1.25,

with ``w_k`` dealt as HeteroFL deals them without ``client_levels``: client ``k`` of the
population at level ``k mod L`` (``algorithms/width_fedavg.py``). Two other readings are
recorded beside it: the mean width ``(1 / m) Σ_k w_k`` itself (0.47 for W2's cohort: it
overstates the CNN's work, whose FLOPs shrink about as the width squared) and the FLOP
share of the one model cut to the mean width, ``F(mean w) / F(1)`` (0.23 for W2: FLOPs are
convex in the width, so this is below the work the clients do, 0.34, and even a round
that costs exactly its FLOPs would miss ``1.25 x`` it).

>>> from fedjax_het import models
>>> model = models.mlp((4,), 3, hidden=(8, 8))  # F(1) = 2 (32 + 64 + 24), F(1/2) = 2 (16 + 16 + 12)
>>> share = cohort_share(model, (4,), (1.0, 0.5), [0, 1, 2, 3, 5])  # levels 0, 1, 0, 1, 1
>>> round(share["mean_width"], 6), round(share["width_flop_share"], 6)  # (2 + 3 x 44/120) / 5
(0.7, 0.62)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models
from fedjax_het.algorithms import submodels
from fedjax_het.engine.flops import forward_flops

SLACK = 1.25  # the target: at most 1.25 x the round's share of FedAvg's round


def dealt_levels(ids: Sequence[int], num_widths: int) -> np.ndarray:
    """Each client's width level as HeteroFL deals them without ``client_levels``."""
    return np.asarray(ids, np.int64) % num_widths


def cohort_share(
    model: models.Model,
    example_shape: Sequence[int],
    widths: tuple[float, ...],
    ids: Sequence[int],
) -> dict[str, float]:
    """The cohort ``ids``' mean width, its FLOP share (the target's basis, ``limit`` =
    SLACK times it) and the FLOP share of the model cut to the mean width."""
    levels = dealt_levels(ids, len(widths))
    one = jax.ShapeDtypeStruct((1, *example_shape), jnp.float32)
    costs = submodels.width_costs(model, one, widths, levels, ordered_dropout=False)
    mean_width = float(np.mean(np.asarray(widths)[levels]))
    cut = forward_flops(model.at_width(mean_width), one) / forward_flops(model, one)
    share = float(np.mean(costs.compute))
    return {
        "mean_width": mean_width,
        "width_flop_share": share,
        "width_flop_limit": SLACK * share,
        "mean_width_model_flop_share": float(cut),
    }
