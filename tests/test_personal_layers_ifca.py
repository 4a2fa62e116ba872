"""FedPer, FedRep and IFCA against float64 per-client sequential references written here.

The references train a one-hidden-layer ReLU MLP (``models.mlp``: ``Dense_0``
the body, ``Dense_1`` the head) client after client with numpy SGD on the
masked mean cross-entropy, its gradient written out by hand, and aggregate in
float64. Only the row indices of each client's batches come from the engine
(``local.client_batches``); step counts and example masks are rebuilt from
``LocalWork``'s definition. Rounds run as the engine runs them
(``Round.train_cohort``: gather, chunked vmap, aggregate, server step,
scatter of the client states that counted) with chunk 2 over cohorts of 3,
ragged clients of 1 to 30 examples, per-client step limits and a weight-0
client, over two rounds in which the persistent client state matters.
Tolerance, float32 engine vs float64 reference: rtol 1e-5, atol 1e-6.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.ifca import ifca
from fedjax_het.algorithms.personal_layers import fedper, fedrep
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.engine import local
from fedjax_het.engine.hooks import Personalized
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.sampling import uniform
from fedjax_het.system.sampler import Sampler
from fedjax_het.training.options import run_options
from fedjax_het.training.simulate import run

F, C, H = 5, 3, 6
SIZES = (1, 6, 17, 30)
CLIENT_LR, SERVER_LR = 0.1, 0.7
RTOL, ATOL = 1e-5, 1e-6
WORK = LocalWork(batch_size=4, epochs=1.5)
MLP = models.mlp((F,), C, hidden=(H,))
NO = local.NO_STEP_LIMIT
ROUNDS = (  # (cohort ids, step limits, weights) of each round
    ((2, 0, 3), (NO, NO, 3), (17.0, 1.0, 0.0)),  # client 3 trains 3 steps but counts for nothing
    ((3, 2, 1), (2, NO, NO), (30.0, 17.0, 6.0)),  # client 2 again, with the head it kept
)
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def make_store(seed: int = 0) -> ClientArrays:
    gen = np.random.default_rng(seed)
    xs = [gen.normal(k - 1.5, 1.0, (n, F)).astype(np.float32) for k, n in enumerate(SIZES)]
    ys = [gen.integers(0, C, n).astype(np.int32) for n in SIZES]
    return ClientArrays.from_clients(xs, ys)


def fixed_sampler(ids) -> Sampler:
    ids = jnp.asarray(ids, jnp.int32)
    return Sampler(select=lambda key, r: ids, num_clients=len(SIZES), cohort_size=len(ids))


def make_round(algorithm, ids=(0, 1, 2), chunk=2) -> Round:
    max_count = max(SIZES)
    spec = local.LocalSpec(MLP, algorithm, WORK, WORK.static_steps(max_count), max_count)
    return Round(MLP, algorithm, fixed_sampler(ids), spec, chunk=chunk)


@functools.partial(fast_jit, static_argnums=(0, 1))
def start(model, algorithm, hyper, key):
    return init_state(model, algorithm, len(SIZES), hyper, key)


@functools.partial(fast_jit, static_argnums=0)
def engine_batches(spec, tasks, train):
    """The engine's row indices ``[m, max_steps, batch]`` and step counts ``[m]``."""
    indices, _, steps = jax.vmap(lambda task: local.client_batches(spec, task, train))(tasks)
    return indices, steps


def make_tasks(round_idx, ids, limits, weights, key) -> local.ClientTask:
    ids = jnp.asarray(ids, jnp.int32)
    return local.ClientTask(
        client_id=ids,
        weight=jnp.asarray(weights, jnp.float32),
        step_limit=jnp.asarray(limits, jnp.int32),
        key=fast_jit(rng.client_keys, static_argnums=2)(key, jnp.int32(round_idx), "train", ids),
    )


# ---- the float64 reference -------------------------------------------------------------


def as64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), jax.device_get(tree))


def forward(params, x):
    hidden = x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
    return hidden, np.maximum(hidden, 0) @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]


def example_losses(params, x, y):
    logits = forward(params, x)[1]
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return log_z - logits[np.arange(len(y)), y]


def gradient(params, x, y, mask):
    """Gradient of the masked mean cross-entropy, by hand."""
    hidden, logits = forward(params, x)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = (p - np.eye(C)[y]) * (mask / max(mask.sum(), 1.0))[:, None]
    relu = np.maximum(hidden, 0)
    g_hidden = (g @ params["Dense_1"]["kernel"].T) * (hidden > 0)
    return {
        "Dense_0": {"kernel": x.T @ g_hidden, "bias": g_hidden.sum(axis=0)},
        "Dense_1": {"kernel": relu.T @ g, "bias": g.sum(axis=0)},
    }


def expected_work(count: int, max_steps: int, step_limit: int):
    """Steps and ``[max_steps, batch]`` example mask from LocalWork's definition."""
    examples = math.ceil(WORK.epochs * count)
    steps = min(math.ceil(examples / WORK.batch_size), max_steps, step_limit)
    position = np.arange(max_steps * WORK.batch_size).reshape(max_steps, WORK.batch_size)
    return steps, position < examples


def client_rows(store, spec, k, indices, engine_steps, step_limit):
    """Client ``k``'s (x, y, row indices, example mask, steps), checked against the engine."""
    start_row, count = int(store.offset[k]), int(store.count[k])
    assert np.all((indices >= start_row) & (indices < start_row + count)), f"{k} reads foreign rows"
    steps, mask = expected_work(count, spec.max_steps, step_limit)
    assert engine_steps == steps, f"client {k}: {engine_steps} steps, expected {steps}"
    return store.x.astype(np.float64), store.y, indices, mask, steps


def reference_sgd(params, data, lr, trains):
    """float64 SGD over a client's steps; ``trains(s)`` names the layers step ``s`` updates."""
    x, y, indices, mask, steps = data
    params = {name: dict(layer) for name, layer in params.items()}
    for s in range(steps):
        g = gradient(params, x[indices[s]], y[indices[s]], mask[s].astype(np.float64))
        for name in trains(s):
            params[name] = {leaf: params[name][leaf] - lr * g[name][leaf] for leaf in params[name]}
    return params


def tree_close(got, want, rtol=RTOL, atol=ATOL):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


# ---- FedPer and FedRep -----------------------------------------------------------------

HEAD_SHARE = 0.6


def fedper_trains(s, steps):
    return ("Dense_0", "Dense_1")


def fedrep_trains(s, steps):
    """The head for the first floor(0.6 steps + 1/2) steps, then the body."""
    return ("Dense_1",) if s < math.floor(HEAD_SHARE * steps + 0.5) else ("Dense_0",)


@pytest.mark.parametrize(
    "algorithm, trains",
    [
        (fedper(client_lr=CLIENT_LR, server_lr=SERVER_LR), fedper_trains),
        (fedrep(head_share=HEAD_SHARE, client_lr=CLIENT_LR, server_lr=SERVER_LR), fedrep_trains),
    ],
    ids=["fedper", "fedrep"],
)
def test_personal_layers_match_sequential_reference(algorithm, trains):
    """Two rounds: the global body, every client's head, and a head that never leaves the client.

    Client k trains (body_t, head_k) with FedPer's joint SGD or FedRep's head-then-body
    steps (head share 0.6, of the steps it takes); the server moves the body by
    0.7 x the weighted mean of the body deltas of the clients that count; a
    client that counts keeps its trained head. The global head is bitwise its
    initial value (zero updates); the weight-0 client's head and the heads of
    clients not selected are bitwise unchanged. rtol 1e-5, atol 1e-6.
    """
    store, key = make_store(), rng.seed_key(5)
    hyper = algorithm.hyper()
    round_ = make_round(algorithm)
    train = device_split(store)
    state = start(MLP, algorithm, hyper, key)
    initial = as64(state.server_state.params)
    body, heads = {"Dense_0": initial["Dense_0"]}, [{"Dense_1": initial["Dense_1"]}] * len(SIZES)
    train_cohort = fast_jit(round_.train_cohort)
    for r, (ids, limits, weights) in enumerate(ROUNDS):
        tasks = make_tasks(r, ids, limits, weights, key)
        all_indices, all_steps = jax.device_get(engine_batches(round_.spec, tasks, train))
        old_states = jax.device_get(state.client_states)
        state, _, _ = train_cohort(state, jnp.asarray(ids, jnp.int32), tasks, hyper, train)
        total, new_heads = jax.tree.map(np.zeros_like, body), list(heads)
        for slot, k in enumerate(ids):
            data = client_rows(
                store, round_.spec, k, all_indices[slot], all_steps[slot], limits[slot]
            )
            trained = reference_sgd(
                {**body, **heads[k]}, data, CLIENT_LR, lambda s, n=data[-1]: trains(s, n)
            )
            if weights[slot] > 0:
                total = jax.tree.map(
                    lambda t, b, p, w=weights[slot]: t + w * (b - p),
                    total,
                    body,
                    {"Dense_0": trained["Dense_0"]},
                )
                new_heads[k] = {"Dense_1": trained["Dense_1"]}
        norm = sum(w for w in weights if w > 0)
        body = jax.tree.map(lambda b, t, n=norm: b - SERVER_LR * t / n, body, total)
        heads = new_heads
        params = algorithm.global_params(state.server_state)
        tree_close(params["Dense_0"], body["Dense_0"])
        np.testing.assert_array_equal(params["Dense_1"]["kernel"], initial["Dense_1"]["kernel"])
        np.testing.assert_array_equal(params["Dense_1"]["bias"], initial["Dense_1"]["bias"])
        states = jax.device_get(state.client_states)
        counted = {k for k, w in zip(ids, weights) if w > 0}
        for k in range(len(SIZES)):
            mine = jax.tree.map(lambda s, k=k: s[k], states)
            if k not in counted:  # not selected, or weight 0: the state is untouched
                jax.tree.map(
                    lambda a, b, k=k: np.testing.assert_array_equal(a, b[k]), mine, old_states
                )
            tree_close(mine, heads[k])
    personal = fast_jit(jax.vmap(algorithm.hook(Personalized).params, in_axes=(None, 0)))(
        state.server_state, state.client_states
    )
    tree_close(jax.tree.map(lambda p: p[2], personal), {**body, **heads[2]})


# ---- IFCA ------------------------------------------------------------------------------

CLUSTERS = 4


def test_ifca_matches_sequential_reference():
    """Two rounds of IFCA with 4 clusters: choices, per-cluster means, sizes, stored clusters.

    Each client evaluates the 4 models on the examples of its round (float64
    here) and joins the argmin; the reference asserts the best loss beats the
    runner-up by more than 1e-4 relative, so float32 cannot choose otherwise.
    Each cluster's model moves by 0.7 x the weighted mean of its counted
    members' deltas; at most 3 count, so at least one cluster keeps its model
    bitwise. The weight-0 client's stored cluster stays -1. rtol 1e-5, atol 1e-6.
    """
    algorithm = ifca(
        num_clusters=CLUSTERS, init_noise=1.0, client_lr=CLIENT_LR, server_lr=SERVER_LR
    )
    store, key = make_store(), rng.seed_key(2)
    hyper = algorithm.hyper()
    round_ = make_round(algorithm)
    train = device_split(store)
    state = start(MLP, algorithm, hyper, key)
    stacked = as64(state.server_state.models.params)
    cluster_models = [jax.tree.map(lambda m, j=j: m[j], stacked) for j in range(CLUSTERS)]
    plain = fedavg()  # its global model is the one initial model, initialised as IFCA's is
    base = as64(start(MLP, plain, plain.hyper(), key).server_state.params)
    # model 0 is that model, up to ulps: XLA fuses the initialiser differently in the two programs
    tree_close(cluster_models[0], base, rtol=1e-6, atol=1e-7)
    assert not np.allclose(cluster_models[1]["Dense_0"]["kernel"], base["Dense_0"]["kernel"])
    stored, chosen = [-1] * len(SIZES), set()
    train_cohort = fast_jit(round_.train_cohort)
    for r, (ids, limits, weights) in enumerate(ROUNDS):
        tasks = make_tasks(r, ids, limits, weights, key)
        all_indices, all_steps = jax.device_get(engine_batches(round_.spec, tasks, train))
        state, _, metrics = train_cohort(state, jnp.asarray(ids, jnp.int32), tasks, hyper, train)
        totals = [jax.tree.map(np.zeros_like, cluster_models[0]) for _ in range(CLUSTERS)]
        norms, sizes, new_stored = [0.0] * CLUSTERS, [0] * CLUSTERS, list(stored)
        for slot, k in enumerate(ids):
            data = client_rows(
                store, round_.spec, k, all_indices[slot], all_steps[slot], limits[slot]
            )
            x, y, indices, mask, steps = data
            rows = indices[:steps][mask[:steps]]
            losses = np.array([example_losses(m, x[rows], y[rows]).mean() for m in cluster_models])
            j = int(np.argmin(losses))
            runner_up = np.sort(losses)[1]
            assert runner_up - losses[j] > 1e-4 * abs(losses[j]), f"near tie for client {k}"
            trained = reference_sgd(
                cluster_models[j], data, CLIENT_LR, lambda s: ("Dense_0", "Dense_1")
            )
            if weights[slot] > 0:
                w = weights[slot]
                totals[j] = jax.tree.map(
                    lambda t, m, p, w=w: t + w * (m - p), totals[j], cluster_models[j], trained
                )
                norms[j], sizes[j], new_stored[k] = norms[j] + w, sizes[j] + 1, j
                chosen.add(j)
        cluster_models = [
            jax.tree.map(lambda m, t, n=n: m - SERVER_LR * t / n, m, t) if n > 0 else m
            for m, t, n in zip(cluster_models, totals, norms)
        ]
        stored = new_stored
        np.testing.assert_array_equal(metrics["cluster_sizes"], sizes)
        np.testing.assert_array_equal(state.client_states, stored)
        got = jax.device_get(state.server_state.models.params)
        for j in range(CLUSTERS):
            mine = jax.tree.map(lambda m, j=j: m[j], got)
            tolerance = {} if sizes[j] else {"rtol": 0, "atol": 0}  # no members: bitwise kept
            tree_close(mine, cluster_models[j], **tolerance)
    assert len(chosen) >= 2, "the test should exercise more than one cluster"
    personal = fast_jit(algorithm.hook(Personalized).params)(state.server_state, jnp.int32(stored[2]))
    tree_close(personal, cluster_models[stored[2]])


def test_ifca_with_one_cluster_is_fedavg():
    """k = 1: two rounds of Round.step give FedAvg's global model bitwise, all in cluster 0."""
    order = (1, 3, 0, 2)
    store, key = make_store(), rng.seed_key(4)
    train = device_split(store)
    results = []
    for algorithm in (fedavg(), ifca(num_clusters=1)):
        hyper = algorithm.hyper({"client_lr": CLIENT_LR})
        round_ = make_round(algorithm, ids=order, chunk=3)
        state = start(MLP, algorithm, hyper, key)
        step = fast_jit(round_.step)
        for r in range(2):
            state, metrics = step(state, jnp.int32(r), hyper, train, key)
        results.append((algorithm.global_params(state.server_state), metrics))
    (avg, _), (clustered, metrics) = results
    jax.tree.map(np.testing.assert_array_equal, clustered, avg)
    np.testing.assert_array_equal(metrics["cluster_sizes"], [len(order)])


# ---- validation and a whole run --------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: fedper(personal_layers=0),
        lambda: fedrep(personal_layers=1.5),
        lambda: fedrep(head_share=1.5),
        lambda: fedrep().hyper({"head_share": -0.1}),
        lambda: ifca(num_clusters=0),
        lambda: ifca(num_clusters=True),
        lambda: ifca().hyper({"init_noise": -1.0}),
        lambda: fedper(personal_layers=2).client_init(MLP.init(jax.random.key(0))),
        lambda: fedrep().client_init(models.logistic_regression((F,), C).init(jax.random.key(0))),
    ],
)
def test_impossible_settings_are_one_line_errors(make):
    with pytest.raises(ValueError) as error:
        make()
    assert "\n" not in str(error.value)


def numpy_accuracy(params, x, y) -> float:
    return float(np.mean(np.argmax(forward(as64(params), x.astype(np.float64))[1], axis=1) == y))


@pytest.mark.parametrize(
    "algorithm", [fedper(), fedrep(), ifca(num_clusters=2)], ids=["fedper", "fedrep", "ifca"]
)
def test_run_reports_each_clients_own_model(algorithm):
    """simulate.run on tiny Synthetic data: personal accuracy is each client's own model
    (global body + own head; its cluster's model) on its own test split, recomputed in numpy;
    IFCA's per-round cluster sizes reach History.round_metrics and count the participants."""
    c = leaf_synthetic(6, alpha=0.5, beta=0.5, seed=0, num_features=F, num_classes=C, size_mean=2.0)
    data = FederatedData.from_client_arrays(
        c.train_x, c.train_y, test_xs=c.test_x, test_ys=c.test_y, num_classes=C
    )
    history = run(
        data,
        *run_options(
            model=MLP,
            algorithm=algorithm,
            sampler=uniform(6, 3),
            rounds=3,
            eval_every=3,
            work=LocalWork(batch_size=8, epochs=1),
            progress=False,
        ),
    )
    assert history.personal_accuracy is not None and history.personal_accuracy.shape == (6,)
    state = history.state
    for k in range(6):
        own = algorithm.hook(Personalized).params(
            state.server_state, jax.tree.map(lambda s, k=k: s[k], state.client_states)
        )
        x, y = data.test.client(k)
        np.testing.assert_allclose(
            history.personal_accuracy[k], numpy_accuracy(own, x, y), atol=1e-6
        )
    assert "personal_accuracy_mean" in history.metrics[-1]
    if algorithm.name == "ifca":
        sizes = history.round_metrics["cluster_sizes"]
        assert sizes.shape == (3, 2) and sizes.dtype == np.int32
        np.testing.assert_array_equal(sizes.sum(axis=1), history.round_metrics["participants"])
