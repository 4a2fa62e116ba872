"""SCAFFOLD and FedDyn against float64 per-client sequential references written here.

The references train multinomial logistic regression client after client with
numpy SGD on the masked mean cross-entropy (gradient in closed form) plus each
algorithm's correction, and keep every client's state across rounds:
SCAFFOLD's ``y <- y - η_l (g(y) - c_i + c)`` with option II's
``c_i+ = c_i - c + (x - y) / (K η_l)`` (Karimireddy et al. 2020, Algorithm 1),
FedDyn's ``θ <- θ - η (∇L(θ) - g_k + α (θ - θ^{t-1}))`` with
``g_k <- g_k - α (θ_k - θ^{t-1})`` and the server's ``h`` (Acar et al. 2021,
Algorithm 1). Only the row indices of each client's batches come from the
engine (``local.client_batches``); step counts and example masks are rebuilt
from ``LocalWork``'s definition. Rounds run as the engine runs them
(``Round.train_cohort``: gather, chunked vmap, aggregate, server step, scatter
of the states that counted) with chunk 2 over cohorts of 3, ragged clients of
1 to 30 examples, per-client step limits (one counted client does no work), a
weight-0 client that trains, and a round in which nobody counts, over four
rounds in which the client state matters.
Tolerance, float32 engine vs float64 reference: rtol 1e-5, atol 1e-6 (measured
worst absolute errors: 1e-7 for the models, 3e-7 for SCAFFOLD's control
variates, which divide a float32 difference of models by ``K η_l``).
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
from fedjax_het.algorithms.feddyn import dyn_mean, feddyn
from fedjax_het.algorithms.scaffold import ClientUpdate, scaffold, scaffold_mean
from fedjax_het.data import LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import ClientStats, weighted_mean
from fedjax_het.engine.round import Round, device_split, init_state, server_stream
from fedjax_het.system.sampler import Sampler

F, C = 5, 3
SIZES = (1, 6, 17, 30)
N = len(SIZES)
CLIENT_LR, SERVER_LR = 0.1, 0.7
RTOL, ATOL = 1e-5, 1e-6
WORK = LocalWork(batch_size=4, epochs=1.5)  # steps per client: 1, 3, 7, 12
LOGREG = models.logistic_regression((F,), C)
NO = local.NO_STEP_LIMIT
ROUNDS = (  # (cohort ids, step limits, weights) of each round
    ((2, 0, 3), (NO, NO, 3), (17.0, 1.0, 0.0)),  # client 3 trains 3 steps but counts for nothing
    ((3, 2, 0), (2, NO, 0), (30.0, 17.0, 1.0)),  # client 2 again; client 0 counts with no work
    ((2, 1, 3), (1, NO, NO), (17.0, 6.0, 30.0)),  # client 2 a third time, cut to one step
    ((0, 1, 3), (NO, NO, NO), (0.0, 0.0, 0.0)),  # nobody counts
)
SCAFFOLD = scaffold(client_lr=CLIENT_LR, server_lr=SERVER_LR)
FEDDYN = feddyn(client_lr=CLIENT_LR)
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def make_store(seed: int = 0) -> ClientArrays:
    gen = np.random.default_rng(seed)
    xs = [gen.normal(k - 1.5, 1.0, (n, F)).astype(np.float32) for k, n in enumerate(SIZES)]
    ys = [gen.integers(0, C, n).astype(np.int32) for n in SIZES]
    return ClientArrays.from_clients(xs, ys)


@functools.cache
def make_round(algorithm, chunk=2, precision="float32") -> Round:
    """The engine's round over clients of ``SIZES`` (``precision="float64"``: under x64)."""
    ids = jnp.arange(3, dtype=jnp.int32)  # unused: the tests pass their own tasks
    sampler = Sampler(select=lambda key, r: ids, num_clients=N, cohort_size=3)
    model = local.run_model(LOGREG, precision)
    spec = local.LocalSpec(
        model, algorithm, WORK, WORK.static_steps(max(SIZES)), max(SIZES), precision=precision
    )
    return Round(model, algorithm, sampler, spec, chunk=chunk)


@functools.partial(fast_jit, static_argnums=(0, 1))
def start(algorithm, model, hyper, key):
    return init_state(model, algorithm, N, hyper, key)


@functools.partial(fast_jit, static_argnums=0)
def train_cohort(round_, state, ids, tasks, hyper, train, server_key=None):
    return round_.train_cohort(state, ids, tasks, hyper, train, server_key)


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


def pack(w, b):
    return {"Dense_0": {"kernel": w, "bias": b}}


def zeros_like(params):
    return jax.tree.map(np.zeros_like, params)


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


def reference_sgd(params, data, lr, extra):
    """float64 SGD on the masked mean cross-entropy plus a term of gradient ``extra(params)``.

    Returns the trained params and the cross-entropy sum (mean batch loss x examples).
    """
    x, y, indices, mask, steps = data
    w, b = params["Dense_0"]["kernel"], params["Dense_0"]["bias"]
    loss_sum = 0.0
    for s in range(steps):
        xb, yb, m = x[indices[s]], y[indices[s]], mask[s].astype(np.float64)
        logits = xb @ w + b
        top = logits.max(axis=1, keepdims=True)
        p = np.exp(logits - top)
        losses = top[:, 0] + np.log(p.sum(axis=1)) - logits[np.arange(len(yb)), yb]
        loss_sum += float(losses @ m)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - np.eye(C)[yb]) * (m / max(m.sum(), 1.0))[:, None]
        e = extra(pack(w, b))["Dense_0"]
        w, b = w - lr * (xb.T @ g + e["kernel"]), b - lr * (g.sum(axis=0) + e["bias"])
    return pack(w, b), loss_sum


def tree_close(got, want, rtol=RTOL, atol=ATOL):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


def run_rounds(
    algorithm, hyper, key, client, server_step, server_extras, *, precision="float32",
    rtol=RTOL, atol=ATOL, client_state=zeros_like,
):  # fmt: skip
    """Runs ROUNDS through the engine and the reference side by side, checking every round.

    The reference's server is a dict: ``"x"``, the global model, and
    ``server_extras(x)`` (each compared with the engine's server-state field of
    that name). ``client(data, server, state_k) -> (trained, new state_k, loss sum)``;
    ``server_step(server, clients) -> server`` with ``clients`` the round's
    ``(trained, old state, new state, weight)``. ``client_state(x)`` is every
    client's first state in the reference (default: zeros like the model).
    """
    store = make_store()
    round_, train = make_round(algorithm, precision=precision), device_split(store)
    hyper = algorithm.hyper(hyper, dtype=local.hyper_dtype(precision))
    state = start(algorithm, round_.model, hyper, key)
    x = as64(algorithm.global_params(state.server_state))
    server = {"x": x, **server_extras(x)}
    states = [client_state(x) for _ in range(N)]
    for r, (ids, limits, weights) in enumerate(ROUNDS):
        tasks = make_tasks(r, ids, limits, weights, key)
        all_indices, all_steps = jax.device_get(engine_batches(round_.spec, tasks, train))
        old_states = jax.device_get(state.client_states)
        state, _, metrics = train_cohort(
            round_, state, jnp.asarray(ids, jnp.int32), tasks, hyper, train,
            server_stream(key, jnp.int32(r)),
        )
        clients, loss_sum, examples = [], 0.0, 0
        for slot, k in enumerate(ids):
            data = client_rows(
                store, round_.spec, k, all_indices[slot], all_steps[slot], limits[slot]
            )
            trained, new, client_loss = client(data, server, states[k])
            clients.append((trained, states[k], new, weights[slot]))
            loss_sum, examples = loss_sum + client_loss, examples + int(data[3][: data[4]].sum())
        server = server_step(server, clients)
        for k, (_, _, new, weight) in zip(ids, clients):
            if weight > 0:
                states[k] = new
        close = functools.partial(tree_close, rtol=rtol, atol=atol)
        close(algorithm.global_params(state.server_state), server["x"])
        for name in server_extras(x):
            close(getattr(state.server_state, name), server[name])
        np.testing.assert_allclose(metrics["train_loss"], loss_sum / examples, rtol=rtol, atol=atol)
        engine_states = jax.device_get(state.client_states)
        counted = {k for k, w in zip(ids, weights) if w > 0}
        for k in range(N):
            mine = jax.tree.map(lambda s, k=k: s[k], engine_states)
            if k not in counted:
                jax.tree.map(
                    lambda a, b, k=k: np.testing.assert_array_equal(a, b[k]), mine, old_states
                )
            close(mine, states[k])
    return server


def weighted_step(x, clients):
    """``Σ_k w_k (x - θ_k) / Σ_k w_k`` over clients with ``w_k > 0`` (zeros when none)."""
    total, norm = zeros_like(x), 0.0
    for trained, _, _, w in clients:
        if w > 0:
            total = jax.tree.map(lambda t, a, b, w=w: t + w * (a - b), total, x, trained)
            norm += w
    return jax.tree.map(lambda t: t / norm if norm else t, total)


def tree_sub(a, b):
    return jax.tree.map(np.subtract, a, b)


# ---- SCAFFOLD --------------------------------------------------------------------------


def scaffold_client(data, server, control):
    """y <- y - η_l (g(y) - c_i + c) for K steps; option II's c_i+, or c_i when K = 0."""
    x, c = server["x"], server["control"]
    drift = tree_sub(c, control)
    trained, loss_sum = reference_sgd(x, data, CLIENT_LR, lambda p: drift)
    steps = data[4]
    if steps == 0:
        return trained, control, loss_sum
    new = jax.tree.map(
        lambda ci, cc, a, b: ci - cc + (a - b) / (steps * CLIENT_LR), control, c, x, trained
    )
    return trained, new, loss_sum


def scaffold_server(server, clients):
    """x <- x - η_g (weighted mean of x - y_i); c <- c + (1/N) Σ Δc_i over clients that count."""
    x = jax.tree.map(
        lambda a, d: a - SERVER_LR * d, server["x"], weighted_step(server["x"], clients)
    )
    control = server["control"]
    for _, old, new, w in clients:
        if w > 0:
            control = jax.tree.map(lambda c, n, o: c + (n - o) / N, control, new, old)
    return {"x": x, "control": control}


def check_scaffold(**precision_and_tolerance):
    """``run_rounds`` for SCAFFOLD; returns the reference's final server."""
    return run_rounds(
        SCAFFOLD, {}, rng.seed_key(5), scaffold_client, scaffold_server,
        lambda x: {"control": zeros_like(x)}, **precision_and_tolerance,
    )  # fmt: skip


def test_scaffold_matches_sequential_reference():
    """Four rounds of SCAFFOLD (option II): global model x, server control c, every c_i.

    Client k trains y from x by y <- y - 0.1 (g(y) - c_k + c) for its K steps and
    sets c_k+ = c_k - c + (x - y) / (0.1 K), or keeps c_k when K = 0; over the
    clients that count, x moves by 0.7 x their weighted mean of y - x and c by
    (1/4) Σ (c_k+ - c_k). The weight-0 client (which trains) and clients not
    selected keep c_k bitwise; in the last round nobody counts and nothing moves.
    The round's train_loss is the cross-entropy alone. rtol 1e-5, atol 1e-6.
    """
    server = check_scaffold()
    assert np.abs(server["control"]["Dense_0"]["kernel"]).max() > 1e-2  # c did move


def test_scaffold_with_zero_controls_is_fedavg_for_a_round():
    """The first round (c = c_i = 0) equals FedAvg's at the same rates, with partial work,
    a client that counts without working and a weight-0 client: rtol 1e-6, atol 1e-7."""
    key, train = rng.seed_key(8), device_split(make_store())
    ids, limits, weights = ROUNDS[1]
    tasks = make_tasks(0, ids, limits, weights, key)
    results = []
    for algorithm in (SCAFFOLD, fedavg()):
        hyper = algorithm.hyper({"client_lr": CLIENT_LR, "server_lr": SERVER_LR})
        state = start(algorithm, LOGREG, hyper, key)
        new, _, _ = train_cohort(
            make_round(algorithm), state, jnp.asarray(ids, jnp.int32), tasks, hyper, train
        )
        results.append(
            (algorithm.global_params(state.server_state), algorithm.global_params(new.server_state))
        )
    (before, after), (fedavg_before, fedavg_after) = results
    tree_close(before, fedavg_before, 0, 0)
    tree_close(after, fedavg_after, 1e-6, 1e-7)
    assert not np.allclose(as64(after)["Dense_0"]["kernel"], as64(before)["Dense_0"]["kernel"])


# ---- FedDyn ----------------------------------------------------------------------------


def feddyn_client(alpha):
    def client(data, server, gradient):
        """θ <- θ - η (∇L(θ) - g_k + α (θ - θ^{t-1})); g_k <- g_k - α (θ_k - θ^{t-1})."""
        x = server["x"]
        trained, loss_sum = reference_sgd(
            x,
            data,
            CLIENT_LR,
            lambda p: jax.tree.map(lambda q, g, s: alpha * (q - s) - g, p, gradient, x),
        )
        new = jax.tree.map(lambda g, t, s: g - alpha * (t - s), gradient, trained, x)
        return trained, new, loss_sum

    return client


def feddyn_server(alpha, server_lr):
    def server_step(server, clients):
        """h <- h - α/N Σ (θ_k - θ); θ <- θ - η_g (weighted mean of θ - θ_k + h/α); none: no change."""
        if not any(w > 0 for *_, w in clients):
            return server
        x, h = server["x"], server["h"]
        for trained, _, _, w in clients:
            if w > 0:
                h = jax.tree.map(lambda a, t, s: a - alpha / N * (t - s), h, trained, x)
        step = weighted_step(x, clients)
        x = jax.tree.map(lambda a, d, b: a - server_lr * (d + b / alpha), x, step, h)
        return {"x": x, "h": h}

    return server_step


def check_feddyn(alpha=0.3, server_lr=1.0, **precision_and_tolerance):
    """``run_rounds`` for FedDyn; returns the reference's final server."""
    return run_rounds(
        FEDDYN, {"feddyn_alpha": alpha, "server_lr": server_lr}, rng.seed_key(6),
        feddyn_client(alpha), feddyn_server(alpha, server_lr), lambda x: {"h": zeros_like(x)},
        **precision_and_tolerance,
    )  # fmt: skip


@pytest.mark.parametrize("alpha, server_lr", [(0.3, 1.0), (0.05, 0.7)])
def test_feddyn_matches_sequential_reference(alpha, server_lr):
    """Four rounds of FedDyn: global model θ, server h, every client's g_k.

    Client k trains θ from θ^{t-1} by SGD at 0.1 on L_k(θ) - <g_k, θ> + α/2
    ||θ - θ^{t-1}||^2 and sets g_k <- g_k - α (θ_k - θ^{t-1}); over the clients
    P that count, h <- h - α/4 Σ (θ_k - θ^{t-1}) and θ^t = θ^{t-1} - η_g
    (weighted mean of θ^{t-1} - θ_k + h/α) (η_g = 1: the paper's mean of θ_k
    minus h/α). The weight-0 client and clients not selected keep g_k bitwise;
    when nobody counts nothing moves. train_loss is L_k alone. rtol 1e-5, atol 1e-6.
    """
    server = check_feddyn(alpha, server_lr)
    assert np.abs(server["h"]["Dense_0"]["kernel"]).max() > 1e-3 * alpha  # h did move


# ---- aggregation, traced hyperparameters, validation -----------------------------------


def test_weight_zero_clients_contribute_exact_zeros():
    """A weight-0 client's NaN update adds nothing to SCAFFOLD's or FedDyn's sums."""
    stats = ClientStats(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2, jnp.int32))
    weights = jnp.array([0.0, 2.0])
    update = {"w": jnp.array([[jnp.nan, 1.0], [2.0, 4.0]])}
    pairs = (
        (scaffold_mean(weighted_mean()), ClientUpdate(update, update)),
        (dyn_mean(weighted_mean()), update),
    )
    for rule, client_updates in pairs:
        sums = jax.tree.map(
            lambda c: c.sum(0), jax.vmap(rule.contribute)(client_updates, weights, stats)
        )
        mean, total, *count = rule.finalize(sums)
        np.testing.assert_array_equal(mean["w"], [2.0, 4.0])
        np.testing.assert_array_equal(total["w"], [2.0, 4.0])
        assert [float(c) for c in count] in ([], [1.0])


@pytest.mark.parametrize(
    "algorithm, name, values",
    [
        (SCAFFOLD, "client_lr", (0.1, 0.25)),
        (FEDDYN, "client_lr", (0.1, 0.25)),
        (FEDDYN, "feddyn_alpha", (0.05, 0.5)),
    ],
)
def test_hyperparameters_are_traced(algorithm, name, values):
    """A jitted round run at two values of a hyperparameter compiles once and differs."""
    key, train = rng.seed_key(9), device_split(make_store())
    ids, limits, weights = ROUNDS[2]
    tasks = make_tasks(0, ids, limits, weights, key)
    round_ = make_round(algorithm)
    results, sizes = [], []
    for value in values:
        hyper = algorithm.hyper({name: value})
        state = start(algorithm, LOGREG, hyper, key)
        new, _, _ = train_cohort(round_, state, jnp.asarray(ids, jnp.int32), tasks, hyper, train)
        results.append(as64(algorithm.global_params(new.server_state)))
        sizes.append(train_cohort._cache_size())
    assert sizes[1] == sizes[0]
    assert not np.allclose(results[0]["Dense_0"]["kernel"], results[1]["Dense_0"]["kernel"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: feddyn(alpha=0.0),
        lambda: feddyn(alpha=-1.0),
        lambda: feddyn(alpha=float("nan")),
        lambda: feddyn().hyper({"feddyn_alpha": 0.0}),
        lambda: feddyn().hyper({"feddyn_alpha": jnp.array([0.1, -0.1])}),
        lambda: feddyn(client_lr=0.0),
        lambda: scaffold(client_lr=-0.1),
        lambda: scaffold().hyper({"server_lr": 0.0}),
        lambda: scaffold().hyper({"scaffold_c": 1.0}),
    ],
)
def test_impossible_settings_are_one_line_errors(make):
    with pytest.raises(ValueError) as error:
        make()
    assert "\n" not in str(error.value)
