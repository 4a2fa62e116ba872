"""What freezing a client's first layers saves on the simulated schedule (FreezeFL, TimelyFL:
the ``Freezing`` hook): the bytes it still uploads at each depth (``upload_bytes``), the FLOPs
of a step at each depth (``step_costs``) and a client's mean step time over its round
(``step_scale``: probe steps at full cost). ``online.OnlineRound`` prices every depth with them
before each client chooses one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.engine.algorithm import LocalContext
from fedjax_het.engine.local import DeviceSplit, LocalSpec
from fedjax_het.transforms.compression import bytes_sent, identity
from fedjax_het.typing import Hyper, Params, PyTree


def upload_bytes(params: Params, masks: PyTree | None = None) -> jax.Array:
    """Bytes of ``params`` sent up: every leaf, or per depth ``[D]`` the leaves ``masks`` train.

    Counted as ``compression.identity()`` sends them: floats go over the simulated
    network as float32 at most, so a float64 run
    (``local.run_model``) models the same deployment, and so the same schedule,
    as the float32 run, with less rounding in its arithmetic.
    """
    if masks is None:
        return jnp.float32(bytes_sent(identity(), params))
    sizes = jax.tree.map(lambda p, m: m * bytes_sent(identity(), p), params, masks)
    return sum(jax.tree.leaves(sizes))


def step_costs(spec: LocalSpec, hyper: Hyper, train: DeviceSplit, masks: PyTree) -> np.ndarray:
    """``[D]`` FLOPs of one local step at each freeze depth, over depth 0's.

    XLA's cost analysis of the gradient of the local loss with respect to
    the leaves that train at that depth: a frozen input-side layer needs no
    weight gradient and no backward pass below it, which XLA removes. Ones
    (no saving) where the backend reports no FLOP count.
    """
    broadcast = spec.model.init(jax.random.key(0))
    leaves, treedef = jax.tree.flatten(broadcast)
    trains = np.asarray([np.asarray(m) for m in jax.tree.leaves(masks)]) > 0  # [leaves, D]
    batch = (
        jnp.zeros((spec.work.batch_size, *train.x.shape[1:]), train.x.dtype),
        jnp.zeros((spec.work.batch_size, *train.y.shape[1:]), train.y.dtype),
        jnp.ones((spec.work.batch_size,), bool),
    )

    def flops(depth: int) -> float | None:
        kept = [i for i in range(len(leaves)) if trains[i, depth]]

        def loss(trained):
            values = list(leaves)
            for i, value in zip(kept, trained):
                values[i] = value
            params = jax.tree.unflatten(treedef, values)
            ctx = LocalContext(
                broadcast, broadcast, spec.algorithm.client_init(broadcast), jnp.int32(0),
                jnp.int32(1),
            )
            return spec.algorithm.local.loss(
                spec.model, params, batch, ctx, hyper, jax.random.key(0)
            )

        analysis = jax.jit(jax.grad(loss)).lower([leaves[i] for i in kept]).compile()
        analysis = analysis.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        return (analysis or {}).get("flops")

    counts = [flops(d) for d in range(trains.shape[1])]
    if any(c is None or c <= 0 for c in counts):
        return np.ones(len(counts), np.float32)
    return (np.asarray(counts) / counts[0]).astype(np.float32)


def step_scale(steps_needed: jax.Array, step_costs: jax.Array, probe: jax.Array) -> jax.Array:
    """``[N, D]`` mean step time at each depth over depth 0's: probe steps at full cost."""
    needed = jnp.maximum(steps_needed, 1)[:, None]
    probed = jnp.minimum(probe, steps_needed)[:, None]
    return (probed + (needed - probed) * step_costs[None, :]) / needed
