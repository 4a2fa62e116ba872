"""The vectorised round equals a per-client sequential reference (docs/design.md §7).

The references are written here, independently of the engine: multinomial
logistic regression trained client by client with float64 numpy SGD on the
masked mean cross-entropy, then FedAvg's example-weighted (or uniform) mean
of the clients' params (McMahan et al. 2017, Algorithm 1), and the server
optimizers of Reddi et al. 2021 (Algorithm 2) as closed forms. Only the
drawing of batch indices is shared with the engine (``local.client_batches``);
step counts and example masks are recomputed from ``LocalWork``'s definition.

The test's programs are compiled with XLA's backend (LLVM) optimisation at
level 0: the same HLO and arithmetic, about twice as fast to compile, which
is most of these tests' time on CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms import fedadam, fedavg, fedavgm
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.engine import local
from fedjax_het.engine.cohort import run_cohort
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.system.sampler import Sampler

NUM_FEATURES, NUM_CLASSES = 5, 3
SIZES = (1, 3, 17, 40)  # very different client sizes: a lone example up to ten batches
CLIENT_LR = 0.1
# float32 engine against float64 reference, a few dozen SGD steps: errors are ~1e-7 per step.
RTOL, ATOL = 1e-5, 1e-6
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
LOGREG = models.logistic_regression((NUM_FEATURES,), NUM_CLASSES)
FEDAVG = fedavg()  # module-level model and algorithm: their jitted programs are shared by tests


def make_store(sizes=SIZES, seed=0) -> ClientArrays:
    """Clients of the given sizes, with separable-ish labels so gradients do not vanish."""
    gen = np.random.default_rng(seed)
    xs = [gen.normal(k, 1.0, (n, NUM_FEATURES)).astype(np.float32) for k, n in enumerate(sizes)]
    ys = [gen.integers(0, NUM_CLASSES, n).astype(np.int32) for n in sizes]
    return ClientArrays.from_clients(xs, ys)


def fixed_sampler(ids) -> Sampler:
    """Selects the same clients, in this order, every round."""
    ids = jnp.asarray(ids, jnp.int32)
    return Sampler(select=lambda key, r: ids, num_clients=len(ids), cohort_size=len(ids))


def make_spec(model, algorithm, work, store) -> local.LocalSpec:
    max_count = int(store.count.max())
    return local.LocalSpec(model, algorithm, work, work.static_steps(max_count), max_count)


def expected_work(work: LocalWork, count: int, max_steps: int, step_limit: int):
    """Steps and ``[max_steps, batch]`` example mask from LocalWork's definition (not the engine)."""
    if work.steps is not None:
        examples = work.steps * work.batch_size
    else:
        examples = math.ceil(work.epochs * count)
    steps = min(math.ceil(examples / work.batch_size), max_steps, step_limit)
    position = np.arange(max_steps * work.batch_size).reshape(max_steps, work.batch_size)
    return steps, position < examples


def reference_sgd(params, x, y, indices, mask, steps, lr):
    """float64 SGD on the masked mean softmax cross-entropy of ``logits = x W + b``."""
    w, b = params
    for s in range(steps):
        xb, yb, m = x[indices[s]], y[indices[s]], mask[s].astype(np.float64)
        logits = xb @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        g = (p - np.eye(NUM_CLASSES)[yb]) * (m / max(m.sum(), 1.0))[:, None]
        w, b = w - lr * xb.T @ g, b - lr * g.sum(axis=0)
    return w, b


def client_batches(spec, tasks, train):
    """The engine's row indices ``[m, max_steps, batch]`` and step counts ``[m]`` of a cohort."""
    indices, _, steps = jax.vmap(lambda task: local.client_batches(spec, task, train))(tasks)
    return tasks.client_id, indices, steps


@functools.partial(fast_jit, static_argnums=0)
def round_batches(round_, round_idx, train, key):
    """Ids, row indices and step counts of the cohort ``Round.step`` trains in round ``round_idx``."""
    return client_batches(round_.spec, round_.cohort(round_idx, train, key)[1], train)


def reference_pseudo_gradient(params, store, spec, batches, step_limits, weights):
    """Σ_k w_k (x_t - x_k) / Σ_k w_k over clients with w_k > 0, trained one after another.

    Only the row indices come from the engine; each client's rows, step count
    and example mask are checked or rebuilt from LocalWork's definition.
    """
    x, y = store.x.astype(np.float64), store.y
    ids, all_indices, all_steps = jax.device_get(batches)
    total = [np.zeros_like(p) for p in params]
    for slot, k in enumerate(ids):
        start, count = int(store.offset[k]), int(store.count[k])
        indices = all_indices[slot]
        assert np.all((indices >= start) & (indices < start + count)), f"{k} reads foreign rows"
        steps, mask = expected_work(spec.work, count, spec.max_steps, step_limits[slot])
        assert all_steps[slot] == steps, f"client {k}: {all_steps[slot]} steps, expected {steps}"
        trained = reference_sgd(params, x, y, indices, mask, steps, CLIENT_LR)
        if weights[slot] > 0:
            total = [t + weights[slot] * (p - q) for t, p, q in zip(total, params, trained)]
    norm = sum(w for w in weights if w > 0)
    return [t / norm for t in total]


def as64(params):
    dense = params["Dense_0"]
    return [np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64)]


def assert_close(engine_params, reference, rtol=RTOL, atol=ATOL):
    for got, want in zip(as64(engine_params), reference):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@functools.partial(fast_jit, static_argnums=(0, 1))
def start(model, algorithm, hyper, key):
    """The initial RunState of ``len(SIZES)`` clients, jitted (no eager op-by-op compiles)."""
    return init_state(model, algorithm, len(SIZES), hyper, key)


@functools.partial(fast_jit, static_argnums=(0, 1, 2))
def engine_round(algorithm, spec, chunk, hyper, server_state, tasks, train):
    """local_update + run_cohort + server_update, composed as Round.step does."""
    broadcast = algorithm.broadcast(server_state)
    client_fn = functools.partial(local.local_update, spec, hyper, broadcast, data=train)
    sums, _, stats = run_cohort(client_fn, (), tasks, algorithm.aggregator, chunk=chunk)
    return algorithm.server_update(server_state, algorithm.aggregator.finalize(sums), hyper), stats


def test_step_limits_and_zero_weight_match_reference():
    """FedAvg with per-client step limits (deadlines, partial work), a cap of 8, a weight-0 client.

    The new global model is the example-weighted mean of the clients' params
    (McMahan et al. 2017). 2.5 epochs of batch 5, the cohort in one vmap
    (tolerance rtol 1e-5, atol 1e-6, float32 vs float64):
    the 40-example client is cut by the cap, the 17-example one by its limit
    of 2; the 3-example client has limit 0, so its update is zero but its
    weight still counts in the mean (it took part and did no work); the
    1-example client trains but has weight 0 and is left out of the mean.
    """
    store = make_store()
    hyper = FEDAVG.hyper({"client_lr": CLIENT_LR})
    spec = make_spec(LOGREG, FEDAVG, LocalWork(batch_size=5, epochs=2.5, max_steps=8), store)
    ids = jnp.array([3, 2, 1, 0], jnp.int32)
    limits, weights = [local.NO_STEP_LIMIT, 2, 0, 5], [40.0, 17.0, 3.0, 0.0]
    key = rng.seed_key(7)
    tasks = local.ClientTask(
        client_id=ids,
        weight=jnp.asarray(weights, jnp.float32),
        step_limit=jnp.asarray(limits, jnp.int32),
        key=fast_jit(jax.vmap(rng.client_key, in_axes=(None, 0)))(key, ids),
    )
    train = device_split(store)
    server_state = start(LOGREG, FEDAVG, hyper, key).server_state

    new_state, stats = engine_round(FEDAVG, spec, 4, hyper, server_state, tasks, train)

    params = as64(server_state.params)
    batches = fast_jit(client_batches, static_argnums=0)(spec, tasks, train)
    delta = reference_pseudo_gradient(params, store, spec, batches, limits, weights)
    assert_close(new_state.params, [p - d for p, d in zip(params, delta)])
    np.testing.assert_array_equal(stats.steps, [8, 2, 0, 1])


@functools.partial(fast_jit, static_argnums=0)
def one_client(spec, hyper, params, tasks, slot, train):
    """``local_update`` of cohort slot ``slot`` alone: no client axis anywhere."""
    task = jax.tree.map(lambda a: a[slot], tasks)
    return local.local_update(spec, hyper, params, (), task, train)[0]


def test_mlp_round_matches_unvmapped_local_update_loop():
    """A vmapped MLP round = a Python loop calling local_update once per client, un-vmapped.

    The loop's updates are averaged in float64 numpy with example weights.
    Both sides are float32 JAX; tolerance rtol 1e-5, atol 1e-6.
    """
    store = make_store()
    model = models.mlp((NUM_FEATURES,), NUM_CLASSES, hidden=(8,))
    hyper = FEDAVG.hyper({"client_lr": CLIENT_LR})
    spec = make_spec(model, FEDAVG, LocalWork(batch_size=4, epochs=1.5), store)
    order = (1, 3, 0, 2)
    round_ = Round(model, FEDAVG, fixed_sampler(order), spec, chunk=4)
    train, key = device_split(store), rng.seed_key(11)
    state = start(model, FEDAVG, hyper, key)

    new_state, _ = fast_jit(round_.step)(state, jnp.int32(0), hyper, train, key)

    tasks = fast_jit(round_.cohort)(jnp.int32(0), train, key)[1]
    params = jax.device_get(state.server_state.params)
    total = jax.tree.map(lambda p: np.zeros(p.shape, np.float64), params)
    for slot, k in enumerate(order):
        update = jax.device_get(one_client(spec, hyper, params, tasks, slot, train))
        total = jax.tree.map(
            lambda t, u, w=float(store.count[k]): t + w * u.astype(np.float64), total, update
        )
    norm = float(sum(store.count[k] for k in order))
    want = jax.tree.map(lambda p, t: p.astype(np.float64) - t / norm, params, total)
    jax.tree.map(
        lambda got, w: np.testing.assert_allclose(got, w, rtol=RTOL, atol=ATOL),
        new_state.server_state.params,
        want,
    )


def reference_momentum(lr, momentum):
    """Heavy-ball momentum as in FedAvgM (Hsu et al. 2019): v = g + μ v, x -= lr v."""

    def step(params, grads, trace):
        trace = [g + momentum * v for g, v in zip(grads, trace)] if trace else grads
        return [p - lr * v for p, v in zip(params, trace)], trace

    return step


def reference_adam(lr, b1=0.9, b2=0.99, eps=1e-3):
    """Adam on the pseudo-gradient (FedAdam, Reddi et al. 2021, Algorithm 2, tau = eps).

    With optax's bias correction m/(1-b1^t), v/(1-b2^t), which Reddi et al.'s
    Algorithm 2 does not have; ``optimizers.adam`` builds ``optax.adam``.
    """

    def step(params, grads, state):
        t, m, v = state or (0, [0 * g for g in grads], [0 * g for g in grads])
        t += 1
        m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads)]
        new = [
            p - lr * (mi / (1 - b1**t)) / (np.sqrt(vi / (1 - b2**t)) + eps)
            for p, mi, vi in zip(params, m, v)
        ]
        return new, (t, m, v)

    return step


def test_round_matches_float64_per_client_sgd():
    """Two rounds of Round.step = sequential float64 clients + FedAvgM's server momentum.

    Clients of 1, 3, 17 and 40 examples, 1.5 local epochs of batch 4: a lone
    example, a batch that is mostly mask, masked ragged last batches (the
    17-example client works ceil(25.5 / 4) = 7 steps, the last with 2 rows)
    and a partial second epoch that is a random subset; uniform weighting;
    the cohort in padded chunks of 3; the momentum trace and the server
    learning rate 0.7 (read from ``hyper``) carry into round two. Tolerance
    rtol 1e-5, atol 1e-6 (float32 vs float64).
    """
    algorithm = fedavgm(momentum=0.9, server_lr=0.7)
    store = make_store()
    hyper = algorithm.hyper({"client_lr": CLIENT_LR})
    work = LocalWork(batch_size=4, epochs=1.5)
    spec = make_spec(LOGREG, algorithm, work, store)
    order = (2, 0, 3, 1)  # cohort order unlike store order
    round_ = Round(LOGREG, algorithm, fixed_sampler(order), spec, chunk=3, weighting="uniform")
    train, key = device_split(store), rng.seed_key(3)
    state = start(LOGREG, algorithm, hyper, key)
    step = fast_jit(round_.step)
    reference = reference_momentum(0.7, 0.9)
    params, trace = as64(state.server_state.params), None
    no_limit, uniform = [local.NO_STEP_LIMIT] * len(order), [1.0] * len(order)
    for r in (4, 5):
        batches = round_batches(round_, jnp.int32(r), train, key)
        np.testing.assert_array_equal(batches[0], order)
        state, metrics = step(state, jnp.int32(r), hyper, train, key)
        grads = reference_pseudo_gradient(params, store, spec, batches, no_limit, uniform)
        params, trace = reference(params, grads, trace)
        assert_close(state.server_state.params, params)
    examples = 0
    for k in order:
        steps, mask = expected_work(work, int(store.count[k]), spec.max_steps, local.NO_STEP_LIMIT)
        examples += int(mask[:steps].sum())
    assert int(metrics["examples"]) == examples
    assert int(metrics["participants"]) == len(order)


@pytest.mark.parametrize(
    "algorithm, reference",
    [
        (fedavgm(momentum=0.9, server_lr=0.7), reference_momentum(0.7, 0.9)),
        (fedadam(server_lr=0.05), reference_adam(0.05)),
    ],
    ids=["fedavgm", "fedadam"],
)
def test_server_update_matches_closed_form(algorithm, reference):
    """Four server steps on given pseudo-gradients = the float64 closed form (rtol 1e-5).

    Pseudo-gradient coordinates span 1e-4 to 1 (Adam's eps is 1e-3), and one
    coordinate flips sign between rounds.
    """
    gen = np.random.default_rng(0)
    scale = np.array([1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1.0])
    grads = [gen.standard_normal((4, 6)) * scale for _ in range(4)]
    grads[2][0, -1] = -grads[1][0, -1]
    params64 = [gen.standard_normal(6)]
    hyper = algorithm.hyper()
    state = algorithm.server_init({"w": jnp.asarray(params64[0], jnp.float32)}, hyper, 1)
    update = fast_jit(algorithm.server_update)
    opt_state = None
    for g in grads:
        state = update(state, {"w": jnp.asarray(g.mean(axis=0), jnp.float32)}, hyper)
        params64, opt_state = reference(params64, [g.mean(axis=0)], opt_state)
        np.testing.assert_allclose(state.params["w"], params64[0], rtol=1e-5, atol=1e-7)
