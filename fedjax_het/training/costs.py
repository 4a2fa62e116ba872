"""What a client's round costs on the simulated schedule: the bytes it moves
(``payload_bytes``) and, for sub-models, its share of the full model's cost (``priced``).

Both schedules, planned (``training.plan``) and in-loop (``training.online``), price a round
with these two functions, so they agree.


An algorithm whose clients train part of the model (``SubModel.costs``, ``engine.hooks``:
FjORD, HeteroFL, FedRolex) gives each client a share of a full step's FLOPs and of the
payload's bytes (``engine.hooks.ClientCosts``); the planned schedule
(``training.plan``) and the in-loop one (``training.online``) both apply them with
``priced``, so the two agree, and an algorithm without costs keeps its schedule bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.hooks import ClientCosts, PayloadBytes, SubModel
from fedjax_het.engine.shapes import one_client
from fedjax_het.models import Model
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.transforms.compression import bytes_sent, identity


def payload_bytes(
    algorithm: FederatedAlgorithm, model: Model, x: jax.Array, y: jax.Array
) -> tuple[float, float]:
    """``(down, up)`` bytes one client receives and sends in a round, for inputs shaped like
    ``x`` and labels like ``y``: the algorithm's ``PayloadBytes`` hook on the params
    (compressed encodings), else its broadcast down and its update up (SCAFFOLD's control
    variate travels both ways, IFCA's ``k`` models down and one up), floats counted as
    ``compression.identity()`` sends them (float32 at most, so a float64 run models the
    float32 deployment)."""
    payload = algorithm.hook(PayloadBytes)
    if payload is not None:
        down, up = payload.count(jax.eval_shape(model.init, jax.random.key(0)))
        return float(down), float(up)
    shapes = one_client(algorithm, model, x, y)
    return (
        float(bytes_sent(identity(), shapes.broadcast)),
        float(bytes_sent(identity(), shapes.update)),
    )


def client_costs(
    algorithm: FederatedAlgorithm, model: Model, num_clients: int, x: jax.Array
) -> ClientCosts | None:
    """The algorithm's ``ClientCosts`` for inputs shaped like ``x[:1]`` (None: full model)."""
    submodel = algorithm.hook(SubModel)
    if submodel is None or submodel.costs is None:
        return None
    example = jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype)
    return submodel.costs(num_clients, model, example)


def priced(profiles: ClientProfiles, down, up, costs: ClientCosts | None):
    """``(profiles, down, up)`` with each client's step time and bytes times its cost shares
    (``[N]`` bytes then); unchanged for None. ``profiles`` may be stacked ``[S, N]``."""
    if costs is None:
        return profiles, down, up
    step_time = profiles.step_time
    compute = jnp.broadcast_to(jnp.asarray(costs.compute, step_time.dtype), step_time.shape)
    down, up = (jnp.asarray(np.float64(b) * costs.transfer, jnp.float32) for b in (down, up))
    return profiles.replace(step_time=step_time * compute), down, up
