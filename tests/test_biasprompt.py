"""BiasPrompt+'s server (``algorithms/biasprompt.py``) against a float64 numpy reference.

The reference is the pseudo-code of flhetbench-notes §5.1 (a') written out
here in the notes' own sign (deltas ``θ_local - θ_start``, ``θ <- θ + v + s``),
with the plain means generalised to weighted means (equal weights give the
notes' means): the engine gets the negated deltas, so the sign handling is
checked too. The parameters are a two-leaf pytree whose leaves disagree on the
sign of a dot product, so a per-layer projection would fail. Every update set
also holds a fresh and a stale slot of weight 0 filled with NaN, and a slot
staler than ``max_staleness`` (the notes drop it).

Tolerances, engine vs reference: rtol 1e-5, atol 1e-6 in float32 (measured
worst absolute error 2.4e-7); rtol 1e-12, atol 1e-12 under x64 (measured
2.2e-16). Chunked sums are compared bitwise between chunkings of one device,
and at rtol 1e-6 across two devices (a ``psum`` adds in another order).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import rng
from fedjax_het.algorithms.biasprompt import ServerState, biasprompt_plus
from fedjax_het.algorithms.fedavg import fedavgm
from fedjax_het.engine.algorithm import ClientStats, weighted_mean
from fedjax_het.engine.cohort import client_mesh, run_cohort
from fedjax_het.engine.local import ClientTask

FORMS = ("sum", "seq", "naive")
MAX_STALENESS = 3
BETA, SERVER_LR = 0.9, 0.7
SHAPES = {"a": (3, 2), "b": (4,)}  # flat: a's 6 entries, then b's 4
D = 10
TOLERANCES = {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-12)}
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


# ----- the reference: notes §5.1 (a'), flat float64 vectors, deltas θ_local - θ_start -----


def reference_step(theta, v_prev, deltas, weights, taus, aggregation, beta=BETA, lr=SERVER_LR):
    """One server step; returns ``(θ_new, v, projected, seq_projections)``."""
    counts = [k for k in range(len(weights)) if weights[k] > 0]
    fresh = [k for k in counts if taus[k] == 0]
    stale = [k for k in counts if 1 <= taus[k] <= MAX_STALENESS]
    g = np.zeros(D)
    if fresh:
        g = sum(weights[k] * deltas[k] for k in fresh) / sum(weights[k] for k in fresh)
    v = g + beta * v_prev
    s, projected, seq_projections = np.zeros(D), False, 0
    if stale:
        stale_weight = sum(weights[j] for j in stale)
        if aggregation == "seq":
            running = np.zeros(D)
            for tau in range(MAX_STALENESS, 0, -1):
                bucket = sum((weights[j] * deltas[j] for j in stale if taus[j] == tau), np.zeros(D))
                if running @ bucket < 0:
                    running = running - (running @ bucket) / (bucket @ bucket) * bucket
                    seq_projections += 1
                running = running + bucket
            s = running / stale_weight
        else:
            s = sum(weights[j] * deltas[j] / np.sqrt(1 + taus[j]) for j in stale) / stale_weight
        if aggregation != "naive" and s @ v < 0:
            s = s - (s @ v) / (v @ v) * v
            projected = True
    return theta + lr * (v + s), v, projected, seq_projections


# ----- update sets -----

GEN = np.random.default_rng(0)
F = np.ones(D)  # the fresh direction
CONFLICTS_IN_A = np.r_[-2 * np.ones(6), np.ones(4)]  # <., F> = -8: conflicts overall
AGREES_OVERALL = np.r_[-np.ones(6), 2 * np.ones(4)]  # <., F> = +2, though leaf a conflicts


def noise(scale=0.1):
    return scale * GEN.normal(size=D)


def update_set(*slots):
    """``(deltas [m, D], weights [m], taus [m])`` from ``(delta, weight, tau)`` slots, plus the
    NaN-holding weight-0 fresh and stale slots and a counted slot staler than allowed."""
    nan = np.full(D, np.nan)
    slots = (*slots, (nan, 0.0, 0), (nan, 0.0, 2), (10 * F, 1.0, MAX_STALENESS + 2))
    deltas, weights, taus = zip(*slots)
    return np.stack(deltas), np.asarray(weights), np.asarray(taus, np.int32)


SCENARIOS = {
    "fresh_only": update_set((F + noise(), 1.0, 0), (2 * F + noise(), 3.0, 0), (noise(), 2.0, 0)),
    "stale_only": update_set(
        (-F + noise(0.5), 1.0, 1), (-2 * F + noise(0.5), 2.0, 2), (noise(1), 1.0, 3)
    ),
    "conflicting": update_set(
        (F + noise(), 2.0, 0), (F + noise(), 1.0, 0), (CONFLICTS_IN_A + noise(), 3.0, 2)
    ),
    "not_conflicting": update_set(
        (F + noise(), 2.0, 0), (F + noise(), 1.0, 0), (AGREES_OVERALL + noise(0.01), 3.0, 1)
    ),
    "several_taus": update_set(  # buckets that conflict with each other, a fresh update against them
        (F + noise(), 1.0, 0),
        (CONFLICTS_IN_A + noise(), 1.0, 3),
        (-CONFLICTS_IN_A + noise(), 2.0, 2),
        (-3 * F + noise(), 1.0, 2),
        (CONFLICTS_IN_A + F + noise(), 2.0, 1),
    ),
}
MOMENTUM = {  # the server's v before the step, in the notes' sign
    "fresh_only": np.zeros(D),
    "stale_only": F + noise(),
    "conflicting": noise(),
    "not_conflicting": np.zeros(D),
    "several_taus": 0.5 * F,
}


# ----- the engine -----


def tree(flat, dtype):
    a, b = np.split(np.asarray(flat), [6], axis=-1)
    lead = a.shape[:-1]
    return {"a": jnp.asarray(a.reshape(*lead, *SHAPES["a"]), dtype), "b": jnp.asarray(b, dtype)}


def flat(params) -> np.ndarray:
    leaves = [np.asarray(params[name], np.float64) for name in SHAPES]
    lead = leaves[1].shape[:-1]
    return np.concatenate([x.reshape(*lead, -1) for x in leaves], axis=-1)


def stats_of(taus, m):
    """``m`` slots' stats with staleness ``taus`` (None: a synchronous round)."""
    staleness = None if taus is None else jnp.asarray(taus, jnp.int32)
    return ClientStats(jnp.zeros(m), jnp.zeros(m), jnp.zeros(m, jnp.int32), staleness=staleness)


@functools.partial(fast_jit, static_argnums=0)
def engine_step(algorithm, state, updates, weights, stats, hyper):
    """Every slot's contribution, summed over slots, finalised, and one server step."""
    sums = jax.vmap(algorithm.aggregator.contribute)(updates, weights, stats)
    aggregate = algorithm.aggregator.finalize(jax.tree.map(lambda x: jnp.sum(x, 0), sums))
    return algorithm.server_update(state, aggregate, hyper)


def run_engine(algorithm, theta, v_prev, deltas, weights, taus, dtype):
    hyper = algorithm.hyper({"server_momentum": BETA, "server_lr": SERVER_LR}, dtype=dtype)
    state = ServerState(tree(theta, dtype), tree(-v_prev, dtype))  # our momentum: the negated v
    return engine_step(
        algorithm,
        state,
        tree(-deltas, dtype),
        jnp.asarray(weights, dtype),
        stats_of(taus, len(taus)),
        hyper,
    )


# ----- (1) aggregate + server step against the reference -----


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("aggregation", FORMS)
def test_server_step_equals_the_notes(aggregation, precision):
    rtol, atol = TOLERANCES[precision]
    algorithm = biasprompt_plus(aggregation=aggregation, max_staleness=MAX_STALENESS)
    theta = GEN.normal(size=D)
    with jax.enable_x64(precision == "float64"):
        for name, (deltas, weights, taus) in SCENARIOS.items():
            expected, v, projected, seq_projections = reference_step(
                theta, MOMENTUM[name], deltas, weights, taus, aggregation
            )
            state = run_engine(algorithm, theta, MOMENTUM[name], deltas, weights, taus, precision)
            assert state.params["a"].dtype == precision
            np.testing.assert_allclose(
                flat(state.params), expected, rtol=rtol, atol=atol, err_msg=name
            )
            np.testing.assert_allclose(flat(state.momentum), -v, rtol=rtol, atol=atol, err_msg=name)
            if aggregation != "naive":  # the scenarios do what their names say
                assert projected == (name in ("conflicting", "several_taus", "stale_only")), name
            if aggregation == "seq" and name == "several_taus":
                assert seq_projections == 2


def test_a_projection_conflicting_only_in_one_layer_does_not_happen():
    """``not_conflicting`` conflicts in leaf a alone: flat, nothing is projected (sum = naive)."""
    deltas, weights, taus = SCENARIOS["not_conflicting"]
    theta = np.zeros(D)
    steps = [
        run_engine(
            biasprompt_plus(aggregation=form, max_staleness=MAX_STALENESS),
            theta,
            MOMENTUM["not_conflicting"],
            deltas,
            weights,
            taus,
            "float32",
        )
        for form in ("sum", "naive")
    ]
    np.testing.assert_array_equal(flat(steps[0].params), flat(steps[1].params))


def test_zero_momentum_and_nobody_fresh_projects_nothing():
    """``v = 0`` (no fresh update, no momentum): the guarded division leaves s as it is."""
    deltas, weights, taus = SCENARIOS["stale_only"]
    zero = np.zeros(D)
    for form in FORMS:
        algorithm = biasprompt_plus(aggregation=form, max_staleness=MAX_STALENESS)
        state = run_engine(algorithm, zero, zero, deltas, weights, taus, "float32")
        expected, _, projected, _ = reference_step(zero, zero, deltas, weights, taus, form)
        assert not projected and np.all(np.isfinite(flat(state.params)))
        np.testing.assert_allclose(flat(state.params), expected, rtol=1e-5, atol=1e-6)


# ----- (2) chunk invariance through run_cohort -----


def prepared_client(state, task):
    """A client that reports a prepared update and staleness (its "state")."""
    del task
    update, tau = state
    return update, state, ClientStats(jnp.float32(0), jnp.float32(0), jnp.int32(0), staleness=tau)


@pytest.mark.parametrize("aggregation", FORMS)
def test_sums_do_not_depend_on_chunking(aggregation):
    deltas, weights, taus = SCENARIOS["several_taus"]
    algorithm = biasprompt_plus(aggregation=aggregation, max_staleness=MAX_STALENESS)
    m = len(weights)
    ids = jnp.arange(m, dtype=jnp.int32)
    tasks = ClientTask(
        client_id=ids,
        weight=jnp.asarray(weights, jnp.float32),
        step_limit=jnp.zeros(m, jnp.int32),
        key=rng.client_keys(rng.seed_key(0), 0, "train", ids),
    )
    states = (tree(-deltas, jnp.float32), jnp.asarray(taus))

    def sums(chunk, mesh=None):
        run = fast_jit(
            lambda s, t: run_cohort(
                prepared_client, s, t, algorithm.aggregator, chunk=chunk, mesh=mesh
            )[0]
        )
        return run(states, tasks)

    one_by_one = sums(1)
    for chunk in (2, 3, m):
        jax.tree.map(np.testing.assert_array_equal, sums(chunk), one_by_one)
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7),
        sums(2, client_mesh(2)),
        one_by_one,
    )
    theta = GEN.normal(size=D)
    hyper = algorithm.hyper({"server_momentum": BETA, "server_lr": SERVER_LR})
    state = ServerState(tree(theta, jnp.float32), tree(-MOMENTUM["several_taus"], jnp.float32))
    new = algorithm.server_update(state, algorithm.aggregator.finalize(one_by_one), hyper)
    expected = reference_step(theta, MOMENTUM["several_taus"], deltas, weights, taus, aggregation)
    np.testing.assert_allclose(flat(new.params), expected[0], rtol=1e-5, atol=1e-6)


# ----- (3) momentum over two server steps -----


@pytest.mark.parametrize("aggregation", FORMS)
def test_momentum_accumulates_over_two_steps(aggregation):
    """From ``server_init`` (v = 0): a step with fresh and stale updates, then one where nobody
    fresh counts (v = β v_1, against which the stale part is projected)."""
    algorithm = biasprompt_plus(aggregation=aggregation, max_staleness=MAX_STALENESS)
    hyper = algorithm.hyper({"server_momentum": BETA, "server_lr": SERVER_LR})
    theta = GEN.normal(size=D)
    state = algorithm.server_init(tree(theta, jnp.float32), hyper, 10)
    v = np.zeros(D)
    projections = []
    for name in ("conflicting", "stale_only"):
        deltas, weights, taus = SCENARIOS[name]
        theta, v, projected, _ = reference_step(theta, v, deltas, weights, taus, aggregation)
        projections.append(projected)
        state = engine_step(
            algorithm,
            state,
            tree(-deltas, jnp.float32),
            jnp.asarray(weights, jnp.float32),
            stats_of(taus, len(taus)),
            hyper,
        )
        np.testing.assert_allclose(flat(state.params), theta, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(flat(state.momentum), -v, rtol=1e-5, atol=1e-6, err_msg=name)
    assert projections == ([False, False] if aggregation == "naive" else [True, True])


def test_without_staleness_it_is_fedavgm():
    """A synchronous round (``staleness`` None): every slot is fresh, and two steps are FedAvgM's."""
    algorithm = biasprompt_plus(momentum=BETA, server_lr=SERVER_LR)
    reference = fedavgm(momentum=BETA, server_lr=SERVER_LR)
    theta = tree(GEN.normal(size=D), jnp.float32)
    hyper, reference_hyper = algorithm.hyper(), reference.hyper()
    state = algorithm.server_init(theta, hyper, 10)
    reference_state = reference.server_init(theta, reference_hyper, 10)
    mean = weighted_mean()
    for name in ("fresh_only", "stale_only"):  # the stale-only taus are ignored: all count as fresh
        deltas, weights, _ = SCENARIOS[name]
        updates, weights = tree(-deltas, jnp.float32), jnp.asarray(weights, jnp.float32)
        state = engine_step(algorithm, state, updates, weights, stats_of(None, len(weights)), hyper)
        sums = jax.vmap(mean.contribute)(updates, weights, stats_of(None, len(weights)))
        pseudo_gradient = mean.finalize(jax.tree.map(lambda x: jnp.sum(x, 0), sums))
        reference_state = reference.server_update(reference_state, pseudo_gradient, reference_hyper)
        np.testing.assert_allclose(
            flat(state.params), flat(reference_state.params), rtol=1e-6, atol=1e-7
        )


# ----- (4) bad options -----


@pytest.mark.parametrize(
    "options, message",
    [
        ({"aggregation": "mean"}, "aggregation must be one of"),
        ({"max_staleness": 0}, "max_staleness must be an int >= 1"),
        ({"max_staleness": 2.0}, "max_staleness must be an int >= 1"),
        ({"momentum": 1.0}, r"server_momentum must lie in \[0, 1\)"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as error:
        biasprompt_plus(**options)
    assert "\n" not in str(error.value)
