"""The freezing hook: each client freezes its first layers after a probe (FreezeFL, TimelyFL).

Chou et al., "FreezeFL", 2023, §III: a client trains a share of its local steps with every
parameter, then picks a freeze depth from what the probe changed and what each depth would
cost. The in-loop schedule (``training.online``) runs the probe, prices every depth with the
client's profile and trains with the chosen mask from the end of the probe on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from fedjax_het.typing import Hyper, Params, PyTree, Update


@dataclasses.dataclass(frozen=True)
class Freezing:
    """Per-client freezing chosen in the round, after a probe.

    Each selected client first trains ``ceil(probe_share * steps)`` of its local steps with
    every parameter, then picks a freeze *depth* ``d`` (its first ``d`` layers stop training
    and are not uploaded).

    Attributes:
      probe_share: share of a client's local steps trained unfrozen before the choice.
      depth_masks: ``params -> pytree`` whose leaves are ``[D]`` 0/1 arrays: entry ``d``
        says whether the leaf trains at freeze depth ``d`` (depth 0 trains everything). The
        engine passes the params' layers as a dict in the order the forward pass uses them
        (``models.layer_order``), not sorted.
      choose: ``(probe_update, seconds [D], soft_deadline, hyper) -> depth`` (int32), from
        the client's update after the probe, its layers in the same order (None when
        ``probe_share`` is 0: no probe runs), and its expected round time at each depth;
        ``soft_deadline`` is the server's running estimate of a round's length (NaN before
        the first round).
    """

    probe_share: float
    depth_masks: Callable[[Params], PyTree]
    choose: Callable[[Update | None, jax.Array, jax.Array, Hyper], jax.Array]
