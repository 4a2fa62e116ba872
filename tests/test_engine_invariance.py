"""What must not change a round: chunking, cohort order, dropped clients, masks, traced numbers.

docs/design.md §3 and §3: results do not depend on the chunk size beyond float
summation order, and randomness is ``fold_in(seed, round, client_id)``, so a
run is bitwise reproducible and independent of cohort order. §4 and STYLE.md
habit 6: an all-true step mask gives bitwise the unmasked result, an
all-false one leaves the client untouched, and a client with no steps or no
weight has no influence even when its data is not finite. STYLE.md habit 4:
one compiled round serves a ``vmap`` over client learning rates.

Rounds here are compiled with XLA's backend (LLVM) optimisation at level 0
(same HLO, about twice as fast to compile); the bitwise claims about masks and
``simulate.run`` are checked on default compilations.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms import fedadam, fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.engine import local
from fedjax_het.engine import round as round_lib
from fedjax_het.engine.cohort import run_cohort
from fedjax_het.sampling import uniform
from fedjax_het.system import setup as system_setup
from fedjax_het.system.sampler import Sampler
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

NUM_FEATURES, NUM_CLASSES, NUM_CLIENTS = 5, 3, 10
CLIENTS = leaf_synthetic(
    NUM_CLIENTS, alpha=0.5, beta=0.5, seed=1, num_features=NUM_FEATURES,
    num_classes=NUM_CLASSES, size_mean=2.0, size_sigma=1.0, min_size=3,
)  # fmt: skip
DATA = FederatedData.from_client_arrays(
    CLIENTS.train_x, CLIENTS.train_y, test_xs=CLIENTS.test_x, test_ys=CLIENTS.test_y,
    num_classes=NUM_CLASSES,
)  # fmt: skip
MODEL = models.logistic_regression((NUM_FEATURES,), NUM_CLASSES)
ALGORITHM = fedavg()
HYPER = ALGORITHM.hyper({"client_lr": 0.1})
MAX_COUNT = int(DATA.train.count.max())
# 1.5 epochs: a partial second epoch, so which rows a client sees depends on its key.
WORK = LocalWork(batch_size=4, epochs=1.5)
SPEC = local.LocalSpec(MODEL, ALGORITHM, WORK, WORK.static_steps(MAX_COUNT), MAX_COUNT)
COHORT = (7, 2, 9, 0, 4, 5, 1, 8)  # 8 of the 10 clients
POISONED_SLOT = 2  # client 9
TRACES = collections.Counter()  # traces of engine_round, by chunk size
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def fixed_sampler(ids) -> Sampler:
    """Selects the same clients, in this order, every round."""
    ids = jnp.asarray(ids, jnp.int32)
    return Sampler(select=lambda key, r: ids, num_clients=NUM_CLIENTS, cohort_size=len(ids))


@functools.partial(fast_jit, static_argnums=0)
def cohort_tasks(ids: tuple[int, ...], round_idx, train, key) -> local.ClientTask:
    """The tasks ``round.Round`` builds for a cohort of ``ids`` (its weights, limits, keys)."""
    round_ = round_lib.Round(MODEL, ALGORITHM, fixed_sampler(ids), SPEC, chunk=1)
    return round_.cohort(round_idx, train, key)[1]


@functools.partial(fast_jit, static_argnums=0)
def engine_round(chunk, hyper, params, tasks, train):
    """One FedAvg round from ``params``: local_update + run_cohort + server_update."""
    TRACES[chunk] += 1
    state = ALGORITHM.server_init(params, hyper, 1)
    client_fn = functools.partial(local.local_update, SPEC, hyper, params, data=train)
    sums, _, stats = run_cohort(client_fn, (), tasks, ALGORITHM.aggregator, chunk=chunk)
    return ALGORITHM.server_update(state, ALGORITHM.aggregator.finalize(sums), hyper).params, stats


def setup(seed=0):
    train = round_lib.device_split(DATA.train)
    params = fast_jit(MODEL.init)(jax.random.key(seed))
    return train, params, cohort_tasks(COHORT, jnp.int32(0), train, rng.seed_key(seed))


def assert_trees_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def max_abs_difference(a, b) -> float:
    gaps = jax.tree.map(lambda x, y: np.max(np.abs(np.asarray(x) - np.asarray(y))), a, b)
    return float(max(jax.tree.leaves(gaps)))


def all_finite(tree) -> bool:
    return all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(tree))


def with_slot(values: jax.Array, slot: int, value) -> jax.Array:
    """``values`` with entry ``slot`` replaced, edited on the host."""
    values = np.array(values)
    values[slot] = value
    return jnp.asarray(values)


def assert_trees_close(a, b, rtol=1e-6, atol=1e-7):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def test_vmapped_chunks_of_any_size_give_the_same_bits():
    """Chunks of 2, 3 (run as 2: cohort.effective_chunk) and 8 give bitwise the same round: the
    sums are a fixed pairwise tree over the slots, whatever the chunks.

    Chunk 1 runs each client without ``vmap``; XLA compiles the unbatched client
    to other kernels, so it matches within rtol 1e-6, atol 1e-7 only.
    """
    train, params, tasks = setup()
    whole, whole_stats = engine_round(len(COHORT), HYPER, params, tasks, train)
    for chunk in (2, 3):
        got, stats = engine_round(chunk, HYPER, params, tasks, train)
        assert_trees_equal((got, stats), (whole, whole_stats))
    single, stats = engine_round(1, HYPER, params, tasks, train)
    assert_trees_close(single, whole)
    np.testing.assert_array_equal(stats.steps, whole_stats.steps)
    np.testing.assert_array_equal(stats.examples, whole_stats.examples)
    np.testing.assert_allclose(stats.loss_sum, whole_stats.loss_sum, rtol=1e-6)
    assert max_abs_difference(whole, params) > 1e-3  # the round did train


def assert_same_run(first: simulate.History, second: simulate.History) -> None:
    """Identical metrics, evaluations and params, bit for bit (wall times aside)."""
    assert first.round_metrics.keys() == second.round_metrics.keys()
    for name in first.round_metrics:
        np.testing.assert_array_equal(first.round_metrics[name], second.round_metrics[name])

    def without_time(history):
        return [{k: v for k, v in m.items() if k != "wall_s"} for m in history.metrics]

    assert without_time(first) == without_time(second)
    np.testing.assert_array_equal(first.client_accuracy, second.client_accuracy)
    assert_trees_equal(first.params, second.params)


def test_same_seed_gives_bitwise_identical_runs():
    """simulate.run twice with one seed: the same run, bit for bit."""

    def once():
        return simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=ALGORITHM,
                sampler=uniform(NUM_CLIENTS, 4),
                rounds=2,
                work=WORK,
                hyper={"client_lr": 0.1},
                seed=3,
                eval_every=2,
                progress=False,
            ),
        )  # fmt: skip

    first = once()
    assert_same_run(first, once())
    assert first.metrics[-1]["test_loss"] != first.metrics[0]["test_loss"]  # it trained


def test_adaptive_server_under_deadlines_and_dropout_does_not_depend_on_the_chunk():
    """FedAdam with log-normal devices, dropout 0.2 and partial work at a 1 s deadline.

    Its adaptive step amplifies any last-bit difference in the aggregate over
    rounds (when each chunk's total joined a running sum, chunks 3 and 7 drifted
    5e-4 apart in 20 rounds). Chunks 3 and 7 are the same run bit for bit;
    chunk 1 (no ``vmap``) stays within 1e-5 of them.
    """
    sys = system_setup.System(
        system_setup.profiles_from_options(NUM_CLIENTS, devices="lognormal", step_time=0.2, dropout=0.2),
        system_setup.policy_from_options(kind="deadline", deadline=1.0, on_late="partial"),
    )

    def with_chunk(chunk):
        return simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=fedadam(),
                sampler=uniform(NUM_CLIENTS, 8),
                rounds=8,
                work=WORK,
                hyper={"client_lr": 0.1, "server_lr": 0.05},
                eval_every=4,
                chunk=chunk,
                system=sys,
                devices=1,
                progress=False,
            ),
        )  # fmt: skip

    three = with_chunk(3)
    assert np.sum(three.round_metrics["dropped"]) > 0
    assert_same_run(three, with_chunk(7))
    assert max_abs_difference(three.params, with_chunk(1).params) < 1e-5


def poisoned(train: local.DeviceSplit, client: int) -> local.DeviceSplit:
    """``train`` with every feature of ``client`` replaced by NaN, +inf and -inf."""
    start, count = int(DATA.train.offset[client]), int(DATA.train.count[client])
    x = np.array(train.x)
    x[start : start + count] = np.resize(np.array([np.nan, np.inf, -np.inf]), (count, NUM_FEATURES))
    return train.replace(x=jnp.asarray(x))


@pytest.mark.parametrize("chunk", [1, 3])
def test_zero_weight_client_with_nonfinite_data_has_no_influence(chunk):
    """A trained client of weight 0 whose rows are NaN/inf: the round is bitwise the clean one."""
    train, params, tasks = setup()
    tasks = tasks.replace(weight=with_slot(tasks.weight, POISONED_SLOT, 0.0))
    clean, _ = engine_round(chunk, HYPER, params, tasks, train)
    got, _ = engine_round(chunk, HYPER, params, tasks, poisoned(train, COHORT[POISONED_SLOT]))
    assert all_finite(got)
    assert_trees_equal(got, clean)


@pytest.mark.parametrize("chunk", [1, 3])
def test_zero_step_client_with_nonfinite_data_has_no_influence(chunk):
    """A counted client with step limit 0 whose rows are NaN/inf: bitwise the clean round.

    Its update is exactly zero (it did no work), so only its weight enters the
    mean, and its training-loss contribution is zero, not NaN.
    """
    train, params, tasks = setup()
    tasks = tasks.replace(step_limit=with_slot(tasks.step_limit, POISONED_SLOT, 0))
    clean, _ = engine_round(chunk, HYPER, params, tasks, train)
    got, stats = engine_round(chunk, HYPER, params, tasks, poisoned(train, COHORT[POISONED_SLOT]))
    assert float(stats.loss_sum[POISONED_SLOT]) == 0.0
    assert all_finite(got)
    assert_trees_equal(got, clean)


STEPS_SPEC = local.LocalSpec(
    MODEL, ALGORITHM, LocalWork(batch_size=4, epochs=None, steps=6), 6, MAX_COUNT
)


@jax.jit
def masked_client(params, tasks, step_limit, train):
    """The engine's local update of slot 0 under STEPS_SPEC (every example mask all true)."""
    task = jax.tree.map(lambda a: a[0], tasks).replace(step_limit=step_limit)
    update, _, stats = local.local_update(STEPS_SPEC, HYPER, params, (), task, train)
    indices = local.client_batches(STEPS_SPEC, task, train)[0]
    return update, stats, indices


@jax.jit
def unmasked_client(params, indices, train):
    """Local SGD written without any mask: scan over batches, mean loss, optax step."""
    optimizer = ALGORITHM.local.optimizer(HYPER)

    def step(carry, rows):
        p, opt_state = carry
        x, y = train.x[rows], train.y[rows]

        def loss(q):
            outputs = MODEL.apply(q, x, train=True, key=None)
            return jnp.mean(MODEL.per_example_loss(outputs, y))

        updates, opt_state = optimizer.update(jax.grad(loss)(p), opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), None

    (trained, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), indices)
    return jax.tree.map(lambda a, b: a - b, params, trained)


def test_all_true_mask_is_the_unmasked_step_and_all_false_is_identity():
    """Every step active and every example real: the mask-free step function, to float32 rounding.

    The engine's step runs inside a ``lax.cond`` branch (steps past the budget
    are skipped), which XLA compiles apart from the mask-free scan, so the two
    may round differently (measured: 1 ulp). With step limit 0 every step is
    skipped: the update is exactly zero.
    """
    train, params, tasks = setup()
    update, stats, indices = masked_client(params, tasks, local.NO_STEP_LIMIT, train)
    assert int(stats.steps) == 6 and int(stats.examples) == 24
    assert_trees_close(update, unmasked_client(params, indices, train))
    zeros = jax.tree.map(np.zeros_like, params)
    assert max_abs_difference(update, zeros) > 1e-3

    frozen, stats, _ = masked_client(params, tasks, 0, train)
    assert_trees_equal(frozen, zeros)
    assert int(stats.steps) == 0 and int(stats.examples) == 0


def test_client_keys_do_not_depend_on_cohort_order():
    """The cohort in reverse order: per-client results bitwise equal, the round within rtol 1e-6.

    A different seed changes the round, so the comparison is not vacuous.
    """
    train, params, tasks = setup()
    reverse = COHORT[::-1]
    reversed_tasks = cohort_tasks(reverse, jnp.int32(0), train, rng.seed_key(0))
    np.testing.assert_array_equal(
        jax.random.key_data(reversed_tasks.key), jax.random.key_data(tasks.key)[::-1]
    )
    got, got_stats = engine_round(1, HYPER, params, reversed_tasks, train)
    want, want_stats = engine_round(1, HYPER, params, tasks, train)
    assert_trees_close(got, want)
    assert_trees_equal(got_stats, jax.tree.map(lambda a: a[::-1], want_stats))

    other_seed = cohort_tasks(COHORT, jnp.int32(0), train, rng.seed_key(1))
    other, _ = engine_round(1, HYPER, params, other_seed, train)
    assert max_abs_difference(other, want) > 1e-4


def test_vmap_over_client_lr_is_one_trace_and_matches_separate_runs():
    """One round vmapped over two client learning rates = two separate rounds (rtol 1e-6).

    The round is traced at most once for the two separate calls and the vmap
    together: the learning rate is a traced number, never a Python constant.
    """
    train, params, tasks = setup()
    chunk = 3
    lrs = (0.05, 0.3)
    hypers = [ALGORITHM.hyper({"client_lr": lr}) for lr in lrs]
    before = TRACES[chunk]
    separate = [engine_round(chunk, h, params, tasks, train)[0] for h in hypers]
    stacked = jax.tree.map(lambda *v: jnp.asarray(np.stack(v)), *hypers)
    both = jax.vmap(lambda h: engine_round(chunk, h, params, tasks, train)[0])(stacked)
    assert TRACES[chunk] >= 1 and TRACES[chunk] - before <= 1  # the counter is live; one trace
    for i, want in enumerate(separate):
        assert_trees_close(jax.tree.map(lambda a, i=i: np.asarray(a)[i], both), want)
    assert max_abs_difference(*separate) > 1e-3
