"""Each client's share of the full model's cost on the simulated schedule (sub-models).

An algorithm whose clients train part of the model (``FederatedAlgorithm.client_costs``:
FjORD, HeteroFL, FedRolex) gives each client a share of a full step's FLOPs and of the
payload's bytes (``engine.algorithm.ClientCosts``); the planned schedule
(``training.plan``) and the in-loop one (``training.online``) both apply them with
``priced``, so the two agree, and an algorithm without costs keeps its schedule bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.engine.algorithm import ClientCosts, FederatedAlgorithm
from fedjax_het.models import Model
from fedjax_het.system.profiles import ClientProfiles


def client_costs(
    algorithm: FederatedAlgorithm, model: Model, num_clients: int, x: jax.Array
) -> ClientCosts | None:
    """The algorithm's ``ClientCosts`` for inputs shaped like ``x[:1]`` (None: full model)."""
    if algorithm.client_costs is None:
        return None
    example = jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype)
    return algorithm.client_costs(num_clients, model, example)


def priced(profiles: ClientProfiles, down, up, costs: ClientCosts | None):
    """``(profiles, down, up)`` with each client's step time and bytes times its cost shares
    (``[N]`` bytes then); unchanged for None. ``profiles`` may be stacked ``[S, N]``."""
    if costs is None:
        return profiles, down, up
    step_time = profiles.step_time
    compute = jnp.broadcast_to(jnp.asarray(costs.compute, step_time.dtype), step_time.shape)
    down, up = (jnp.asarray(np.float64(b) * costs.transfer, jnp.float32) for b in (down, up))
    return profiles.replace(step_time=step_time * compute), down, up
