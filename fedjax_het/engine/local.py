"""One client's round of local training: a loop over steps, with masks (docs/design.md §4).

Written for a single client, with no client axis; ``cohort.py`` adds the axis.
The step loop runs ``step_bound`` steps: the client's own count alone, or under
``vmap`` the longest count of its chunk (``cohort.run_cohort`` sorts slots by
work so that chunks are even). A step past the client's ``num_steps``
(deadline, partial work, small client, a late or dropped slot) is masked: the
params update is multiplied by the mask (one fused pass) and the optimizer
state is kept with ``where``. Each step gathers its own batch from the flat
store, so a client holds one batch at a time. A masked step changes nothing,
so how many run (the bound) never changes the result's bits.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het import rng
from fedjax_het.data.batching import LocalWork, batch_indices, steps_for
from fedjax_het.engine.algorithm import Batches, ClientStats, FederatedAlgorithm, LocalContext
from fedjax_het.engine.hooks import CohortProbe, SubModel
from fedjax_het.models import Model
from fedjax_het.typing import ClientState, Hyper, PRNGKey, PyTree, Update

NO_STEP_LIMIT = 2**30
PRECISIONS = ("float32", "bfloat16", "float64")  # of the run (run_model) and local training


@struct.dataclass
class DeviceSplit:
    """The flat store of one split as device arrays (see ``ClientArrays``)."""

    x: jax.Array
    y: jax.Array
    offset: jax.Array
    count: jax.Array


@struct.dataclass
class ClientTask:
    """What one cohort slot needs for its round (all traced).

    Attributes:
      client_id: int32 id of the client in this slot.
      weight: float32 aggregation weight; 0 means the update has no influence.
      step_limit: int32 most steps this client may finish (deadlines, partial work).
      key: this client's key for this round, ``fold_in(fold_in(seed, round), id)``.
      train_mask: 0/1 pytree broadcastable to the params (per leaf: a scalar;
        per unit: an array): which parameters this client trains (freezing,
        sub-models, personal layers). None trains everything, at no cost.
      mask_from: int32 first step the train mask applies to (earlier steps train
        everything: FreezeFL's probe), or None for every step.
      step_bound: int32 steps the step loop runs (at most ``max_steps``), the same for
        every slot of a chunk (``cohort.run_cohort`` sets it to the chunk's most planned
        steps), so that under ``vmap`` the steps past it are skipped, not masked, and a
        step before it but past the client's own count is masked; None: the client's
        own count (under ``vmap`` a select per client).
    """

    client_id: jax.Array
    weight: jax.Array
    step_limit: jax.Array
    key: PRNGKey
    train_mask: PyTree | None = None
    mask_from: jax.Array | None = None
    step_bound: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class LocalSpec:
    """The static parts of local training, fixed for a compiled round."""

    model: Model
    algorithm: FederatedAlgorithm
    work: LocalWork
    max_steps: int
    max_count: int
    unroll: int = 1
    precision: str = "float32"  # "bfloat16": the model's passes in bfloat16 (compute_model);
    # "float64": the whole run (run_model), needs jax_enable_x64

    def __post_init__(self):
        check_precision(self.precision)


def cast_floats(tree: PyTree, dtype: jax.typing.DTypeLike) -> PyTree:
    """``tree`` with every float leaf cast to ``dtype`` (token ids, masks and keys untouched)."""
    cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return jax.tree.map(cast, tree)


def check_precision(precision: str) -> None:
    """Raises a one-line ValueError for an unknown precision, or float64 without 64-bit JAX."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}"
        )
    if precision == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "precision 'float64' needs 64-bit JAX: set JAX_ENABLE_X64=1, or call "
            "jax.config.update('jax_enable_x64', True) before building the run"
        )


def hyper_dtype(precision: str) -> jnp.dtype:
    """The dtype of the traced hyperparameters: float64 in a float64 run, else float32."""
    return jnp.dtype(jnp.float64 if precision == "float64" else jnp.float32)


def run_model(model: Model, precision: str) -> Model:
    """The model a run trains, aggregates and evaluates: ``model`` itself, or in float64 a
    model whose ``init`` gives float64 params and whose ``apply`` casts float inputs to float64.

    A float64 run is for reference work: the params, local steps, the
    algorithm's terms, optimizer states, aggregation and evaluation all run in
    float64 (the data store keeps float32 features, which float64 holds exactly).
    """
    check_precision(precision)
    if precision != "float64":
        return model

    def apply(params: PyTree, x: jax.Array, *, train: bool, key: PRNGKey | None) -> jax.Array:
        return model.apply(params, cast_floats(x, jnp.float64), train=train, key=key)

    init = lambda key: cast_floats(model.init(key), jnp.float64)
    return dataclasses.replace(model, init=init, apply=apply, name=f"{model.name}@float64")


def compute_model(model: Model, precision: str) -> Model:
    """The model local steps run: ``model`` itself in float32, or its bfloat16 compute.

    In bfloat16, ``apply`` casts the float32 master params and the float inputs
    to bfloat16 (``cast_floats``), runs the model's forward pass (and so its
    backward pass) there, and returns float32 outputs. This is mixed precision
    as in Micikevicius et al. 2018 ("Mixed Precision Training", §3), without
    loss scaling (bfloat16 has float32's exponent range): the gradient comes
    back through the cast as float32, and the loss, the algorithm's own terms
    (FedProx's ``||w - w_t||^2``, SCAFFOLD's and FedDyn's corrections, Ditto's
    pull), the optimizer, its state, the update and aggregation stay float32.
    The algorithm's terms stay float32 on purpose: they act on ``w - w_t``,
    which bfloat16's 8-bit mantissa rounds away once ``w`` is near ``w_t``
    (FedProx at ``mu = 5``: 7.5e-2 relative error of a round's update when the
    whole local loss runs in bfloat16, 4e-3 with the model alone).
    """
    if precision != "bfloat16":
        return model  # float32, or float64 (``run_model`` made it so)

    def apply(params: PyTree, x: jax.Array, *, train: bool, key: PRNGKey | None) -> jax.Array:
        params, x = cast_floats((params, x), jnp.bfloat16)
        return cast_floats(model.apply(params, x, train=train, key=key), jnp.float32)

    return dataclasses.replace(model, apply=apply, name=f"{model.name}@{precision}")


def planned_steps(spec: LocalSpec, count: jax.Array, step_limit: jax.Array) -> jax.Array:
    """The local steps a client of ``count`` rows runs under ``step_limit`` (any shape).

    The same count ``client_batches`` returns, without drawing the batches: the
    cohort orders and bounds its chunks by it (``cohort.run_cohort``).
    """
    examples = spec.work.examples_to_process(count)
    steps = steps_for(examples, batch_size=spec.work.batch_size, max_steps=spec.max_steps)
    return jnp.minimum(steps.astype(jnp.int32), step_limit)


def client_batches(
    spec: LocalSpec, task: ClientTask, data: DeviceSplit
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Row indices ``[max_steps, batch]``, example mask and step count of one client's round."""
    count = data.count[task.client_id]
    indices, example_mask, num_steps = batch_indices(
        rng.stream(task.key, "batches"),
        data.offset[task.client_id],
        count,
        spec.work.examples_to_process(count),
        max_steps=spec.max_steps,
        batch_size=spec.work.batch_size,
        max_count=spec.max_count,
        shuffle=spec.work.shuffle,
    )
    return indices, example_mask, jnp.minimum(num_steps, task.step_limit)


def local_update(
    spec: LocalSpec,
    hyper: Hyper,
    broadcast: PyTree,
    client_state: ClientState,
    task: ClientTask,
    data: DeviceSplit,
) -> tuple[Update, ClientState, ClientStats]:
    """Trains one client from ``broadcast`` and returns its update, new state and stats.

    The algorithm's ``local.start`` picks the starting params (and may update
    the client state) from the round's batches; ``local.loss`` is optimised
    for the client's ``num_steps`` steps, on ``compute_model(model,
    spec.precision)`` (``local.start``'s loss measurements, IFCA's and q-FFL's,
    stay on the float32 model); ``local.finalize`` turns the trained params
    into the update and the new client state.
    """
    model, algorithm = spec.model, spec.algorithm
    indices, example_mask, num_steps = client_batches(spec, task, data)
    xs, ys = data.x[indices], data.y[indices]  # every batch, for local.start (else unused)
    steps = jnp.arange(spec.max_steps, dtype=jnp.int32)
    active_examples = example_mask & (steps < num_steps)[:, None]
    start, client_state = algorithm.local.start(
        model, broadcast, client_state, Batches(xs, ys, active_examples), hyper,
        rng.stream(task.key, "start"),
    )
    train_key = rng.stream(task.key, "train")
    optimizer = algorithm.local.optimizer(hyper)
    step_model = compute_model(model, spec.precision)

    def context(s):
        return LocalContext(broadcast, start, client_state, s, num_steps, client_id=task.client_id)

    def loss_fn(params, batch, s, key, factors=None):
        model_s = masked_model(step_model, factors)
        return algorithm.local.loss(model_s, params, batch, context(s), hyper, key)

    def masked_step(s, carry):
        params, opt_state, loss_sum, processed = carry
        at = jnp.minimum(s, spec.max_steps - 1)  # a step past max_steps (unroll) is masked
        rows, mask = indices[at], example_mask[at]
        key = jax.random.fold_in(train_key, s)
        sub_mask, factors = _submodel_step(spec, context(s), data.x[rows], hyper, key)
        loss, grads = jax.value_and_grad(loss_fn)(
            params, (data.x[rows], data.y[rows], mask), s, key, factors
        )
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        active = (s < num_steps).astype(jnp.float32)
        scale = _step_scale(updates, active, task, s, sub_mask)
        params = jax.tree.map(lambda p, u, a: p + jnp.where(a > 0, a * u, 0), params, updates, scale)
        opt_state = jax.tree.map(lambda n, o: jnp.where(active, n, o), new_opt_state, opt_state)
        count = jnp.where(s < num_steps, jnp.sum(mask, dtype=jnp.int32), 0)
        loss_sum = loss_sum + jnp.where(s < num_steps, loss * count, 0.0)
        return params, opt_state, loss_sum, processed + count

    # The loop runs ``bound`` steps in blocks of ``unroll``: a client's own count (under
    # ``vmap`` a select per client), or its chunk's longest (``step_bound``, shared).
    bound = num_steps if task.step_bound is None else jnp.minimum(task.step_bound, spec.max_steps)
    unroll = max(1, min(spec.unroll, spec.max_steps))

    def block(carry):
        b, state = carry
        for i in range(unroll):
            state = masked_step(b * unroll + i, state)
        return b + 1, state

    first = (data.x[indices[0]], data.y[indices[0]], example_mask[0])
    loss_dtype = jax.eval_shape(loss_fn, start, first, 0, train_key).dtype  # float64 in x64 runs
    init = (start, optimizer.init(start), jnp.zeros((), loss_dtype), jnp.zeros((), jnp.int32))
    blocks = (bound + unroll - 1) // unroll
    _, (params, _, loss_sum, processed) = jax.lax.while_loop(
        lambda carry: carry[0] < blocks, block, (jnp.zeros((), jnp.int32), init)
    )
    ctx = LocalContext(
        broadcast, start, client_state, num_steps, num_steps, rng.stream(task.key, "finalize"),
        task.client_id,
    )
    update, client_state = algorithm.local.finalize(params, ctx, hyper)
    stats = ClientStats(loss_sum, processed, num_steps, _trained(spec, task, ctx, first[0], hyper))
    return update, client_state, stats


def client_examples(spec: LocalSpec, task: ClientTask, data: DeviceSplit) -> Batches:
    """Each of the client's examples once, in store order, in batches of the work's size:
    ``[ceil(max_count / batch), batch, ...]``, the mask 0 past its count."""
    batch = spec.work.batch_size
    blocks = -(-spec.max_count // batch)
    position = jnp.arange(blocks * batch, dtype=jnp.int32).reshape(blocks, batch)
    count = data.count[task.client_id]
    rows = data.offset[task.client_id] + jnp.minimum(position, jnp.maximum(count - 1, 0))
    return Batches(data.x[rows], data.y[rows], position < count)


def probe_client(
    spec: LocalSpec,
    hyper: Hyper,
    broadcast: PyTree,
    client_state: ClientState,
    task: ClientTask,
    data: DeviceSplit,
) -> tuple[PyTree, ClientState, ClientStats]:
    """One slot's value of the algorithm's ``CohortProbe`` (on the run's model, as
    ``client_start``'s measurements are); the client state is passed through."""
    examples = client_examples(spec, task, data)
    value = spec.algorithm.hook(CohortProbe).measure(
        spec.model, broadcast, task.client_id, examples, hyper, rng.stream(task.key, "probe")
    )
    count = jnp.sum(examples.mask, dtype=jnp.int32)
    return value, client_state, ClientStats(jnp.zeros(()), count, jnp.zeros((), jnp.int32))


def masked_model(model: Model, factors: PyTree | None) -> Model:
    """``model`` whose forward pass sees ``params * factors`` (a sub-model's mask and scaler,
    ``SubModel.step``), so a masked param's gradient is exactly 0; ``model`` itself for None."""
    if factors is None:
        return model

    def apply(params: PyTree, x: jax.Array, *, train: bool, key: PRNGKey | None) -> jax.Array:
        scaled = jax.tree.map(lambda p, f: p * f.astype(p.dtype), params, factors)
        return model.apply(scaled, x, train=train, key=key)

    return dataclasses.replace(model, apply=apply)


def _submodel_step(
    spec: LocalSpec, ctx: LocalContext, x: jax.Array, hyper: Hyper, key: PRNGKey
) -> tuple[PyTree | None, PyTree | None]:
    """The step's ``(mask, factors)`` of the algorithm's ``SubModel`` (``(None, None)`` without
    one), from its own stream of the step's key."""
    submodel = spec.algorithm.hook(SubModel)
    if submodel is None:
        return None, None
    return submodel.step(spec.model, x, ctx, hyper, rng.stream(key, "submodel"))


def _trained(
    spec: LocalSpec, task: ClientTask, ctx: LocalContext, x: jax.Array, hyper: Hyper
) -> PyTree | None:
    """What the client reports as trained: the task's train mask and its sub-model's."""
    submodel = spec.algorithm.hook(SubModel)
    if submodel is None:
        return task.train_mask
    trained = submodel.trained(spec.model, x, ctx, hyper)
    if task.train_mask is None:
        return trained
    return jax.tree.map(lambda a, b: a * b, trained, task.train_mask)


def _step_scale(
    updates: Update, active: jax.Array, task: ClientTask, s: jax.Array,
    sub_mask: PyTree | None = None,
) -> PyTree:
    """Step ``s``'s factor on each leaf of its update: ``active`` (0 past the client's count),
    times ``task.train_mask`` where it applies (from step ``task.mask_from`` on), times the
    step's sub-model mask ``sub_mask``."""
    scale = jax.tree.map(lambda u: active.astype(u.dtype), updates)
    if sub_mask is not None:
        scale = jax.tree.map(lambda a, m: a * m.astype(a.dtype), scale, sub_mask)
    if task.train_mask is None:
        return scale
    train_mask = task.train_mask
    if task.mask_from is not None:
        train_mask = jax.tree.map(lambda m: jnp.where(s >= task.mask_from, m, 1), train_mask)
    return jax.tree.map(lambda a, m: a * m, scale, train_mask)
