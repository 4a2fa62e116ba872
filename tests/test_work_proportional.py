"""Rounds cost the work their clients do, and compute what every masked step computes.

``cohort.run_cohort`` runs the slots in work order (most planned steps first,
idle slots last), stops each chunk's step loop at its longest client (a chunk
of idle slots runs none), and adds the contributions by a fixed pairwise tree over
that order. Checked here: the tree and the order against numpy; the same bits
with and without the skipping (``proportional=False`` runs every masked step)
for FedAvg, SCAFFOLD (client states written in place), FedBuff (slots from
stale versions) under a deadline row with partial work, late, dropped and
empty slots; the same bits for every vmapped chunk size; the states written in
place equal to a gather and scatter; and that the skipped steps really do not run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms import fedavg, fedbuff, scaffold
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.engine import cohort, local
from fedjax_het.engine import round as round_lib
from fedjax_het.engine.algorithm import ClientStats, weighted_mean
from fedjax_het.engine.client_store import HostStore
from fedjax_het.sampling import uniform
from fedjax_het.system.schedule import DROPPED, EMPTY, LATE, OK, Schedule

NUM_FEATURES, NUM_CLASSES, NUM_CLIENTS = 5, 3, 12
CLIENTS = leaf_synthetic(
    NUM_CLIENTS, alpha=0.5, beta=0.5, seed=2, num_features=NUM_FEATURES,
    num_classes=NUM_CLASSES, size_mean=2.5, size_sigma=0.8, min_size=3,
)  # fmt: skip
DATA = FederatedData.from_client_arrays(CLIENTS.train_x, CLIENTS.train_y, num_classes=NUM_CLASSES)
TRAIN = round_lib.device_split(DATA.train)
MODEL = models.logistic_regression((NUM_FEATURES,), NUM_CLASSES)
WORK = LocalWork(batch_size=4, epochs=1.0)
MAX_COUNT = int(DATA.train.count.max())
KEY = rng.seed_key(5)

# One deadline round of 9 slots: full and partial work (ragged clients), late,
# dropped and empty slots (weight 0, no steps), in no particular order.
SELECTED = np.array([3, 7, 0, 11, 5, 2, 9, 4, 8], np.int32)
OUTCOME = np.array([OK, LATE, OK, OK, DROPPED, OK, EMPTY, OK, LATE], np.int32)
STEPS_DONE = np.array([2**30, 1, 2, 2**30, 0, 1, 0, 2**30, 0], np.int32)
VERSION = np.array([3, 3, 2, 3, 1, 1, 3, 2, 3], np.int32)  # FedBuff: trained from these versions
ROUND = 3


def plan_row() -> Schedule:
    m = len(SELECTED)
    zeros = jnp.zeros(m, jnp.float32)
    return Schedule(
        selected=jnp.asarray(SELECTED), valid=jnp.asarray(OUTCOME != EMPTY),
        outcome=jnp.asarray(OUTCOME), steps_done=jnp.asarray(STEPS_DONE),
        version=jnp.asarray(VERSION), start=jnp.float32(0), duration=jnp.float32(1),
        clock=jnp.float32(1), finish=zeros, bytes_down=zeros, bytes_up=zeros,
    )  # fmt: skip


def make_round(algorithm, chunk, *, proportional=True, ring_depth=0, store=None, model=MODEL):
    spec = local.LocalSpec(model, algorithm, WORK, WORK.static_steps(MAX_COUNT), MAX_COUNT)
    options = {} if store is None else {"store": store}
    return round_lib.Round(
        model, algorithm, uniform(NUM_CLIENTS, len(SELECTED)), spec, chunk=chunk,
        ring_depth=ring_depth, proportional=proportional, **options,
    )  # fmt: skip


def one_round(round_, hyper, state=None):
    """Round ``ROUND`` on the deadline row, jitted; the new state and the round's metrics."""
    if state is None:
        state = round_lib.init_state(
            round_.model, round_.algorithm, NUM_CLIENTS, hyper, KEY, store=round_.store,
            ring_depth=round_.ring_depth,
        )  # fmt: skip
    # Data and plan are arguments, as in a run: constants would let XLA specialise the step
    # loops to their trip counts.
    step = jax.jit(lambda s, train, plan: round_.step(s, jnp.int32(ROUND), hyper, train, KEY, plan))
    return step(state, TRAIN, plan_row())


def assert_trees_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


CASES = {
    "fedavg": (fedavg(), {}),
    "scaffold": (scaffold(), {}),  # client states: the table is read and written in place
    "fedbuff": (fedbuff(), {"ring_depth": 4}),  # slots train from older versions
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_skipping_work_changes_no_bit_and_no_chunk_size_does(name):
    algorithm, options = CASES[name]
    hyper = algorithm.hyper({"client_lr": 0.1})
    masked = one_round(make_round(algorithm, len(SELECTED), proportional=False, **options), hyper)
    for chunk in (2, 3, 4, len(SELECTED)):  # 3 runs as 2 (cohort.effective_chunk)
        got = one_round(make_round(algorithm, chunk, **options), hyper)
        assert_trees_equal(got, masked)
    state, metrics = masked
    assert int(metrics["participants"]) == int(np.sum(OUTCOME == OK))
    initial = round_lib.init_state(MODEL, algorithm, NUM_CLIENTS, hyper, KEY, ring_depth=0)
    moved = jax.tree.map(
        lambda a, b: np.max(np.abs(np.asarray(a) - np.asarray(b))),
        algorithm.global_params(state.server_state),
        algorithm.global_params(initial.server_state),
    )
    assert max(jax.tree.leaves(moved)) > 1e-4  # the round trained


def test_states_written_in_place_equal_a_gather_and_scatter():
    """SCAFFOLD's control variates: the device table updated chunk by chunk in place, and the
    host store's gather-train-scatter, hold the same rows after three rounds."""
    algorithm = scaffold()
    hyper = algorithm.hyper({"client_lr": 0.1})
    in_place, host = make_round(algorithm, 2), make_round(algorithm, 2, store=HostStore())
    a = b = None
    for _ in range(3):
        a, _ = one_round(in_place, hyper, a)
        b, _ = one_round(host, hyper, b)
    ids = np.arange(NUM_CLIENTS)
    assert_trees_equal(in_place.store.read(a.client_states, ids), host.store.read(b.client_states, ids))
    assert_trees_equal(a.server_state, b.server_state)
    written = in_place.store.read(a.client_states, SELECTED[OUTCOME == OK])
    assert all(np.any(np.asarray(leaf) != 0) for leaf in jax.tree.leaves(written))


def test_work_order_and_reduction_tree_match_numpy():
    """The slots sort by planned steps (most first, ties in cohort order, idle last), and the
    sums are a pairwise tree over that order, padded with zeros to a power of two."""
    m = 13
    steps = jnp.asarray([3, 0, 5, 3, 1, 0, 5, 2, 0, 3, 4, 1, 2], jnp.int32)
    weight = jnp.asarray([1, 0, 2, 1, 1, 3, 1, 1, 0, 2, 1, 1, 1], jnp.float32)  # slot 5: no steps
    tasks = local.ClientTask(
        jnp.arange(m, dtype=jnp.int32), weight, steps, jax.random.split(jax.random.key(0), m)
    )
    order = np.asarray(cohort.work_order(tasks, steps))
    np.testing.assert_array_equal(order, [2, 6, 10, 0, 3, 9, 7, 12, 4, 11, 5, 1, 8])

    values = jax.random.normal(jax.random.key(1), (m, 4))

    def client_fn(state, task):
        update = values[task.client_id]
        return update, state, ClientStats(jnp.float32(0), jnp.int32(0), task.step_limit)

    weighted = np.asarray(values) * np.asarray(weight)[:, None]
    level = np.concatenate([weighted[order], np.zeros((16 - m, 4), np.float32)])
    while len(level) > 1:
        level = level[0::2] + level[1::2]
    for chunk in (1, 2, 4, 8, m):
        run = functools.partial(
            cohort.run_cohort, client_fn, None, aggregator=weighted_mean(), chunk=chunk,
            steps=steps,
        )  # fmt: skip
        (sums, total), _, stats = jax.jit(run)(tasks)
        np.testing.assert_array_equal(np.asarray(sums), level[0])
        np.testing.assert_array_equal(stats.steps, steps)  # back in cohort order
        assert float(total) == float(np.sum(weight))


def counting_model(calls: list[int]) -> models.Model:
    """MODEL whose forward pass counts its runs on the host (one per chunk step under vmap)."""

    def apply(params, x, *, train, key):
        jax.debug.callback(lambda: calls.append(1))
        return MODEL.apply(params, x, train=train, key=key)

    return models.Model(MODEL.init, apply, MODEL.per_example_loss, name="counting")


def test_skipped_steps_and_idle_chunks_do_not_run():
    """Chunks of 2 in work order: [7 full, 3 full], [0: 2 steps, 5: 1], [late, late],
    [dropped, empty], [padding]: the forward pass runs max-steps-in-chunk times per chunk with
    work, against every static step of every chunk when each step is only masked."""
    algorithm = fedavg()
    hyper = algorithm.hyper({"client_lr": 0.1})
    counts = {}
    for proportional in (True, False):
        calls = []
        round_ = make_round(algorithm, 2, proportional=proportional, model=counting_model(calls))
        jax.block_until_ready(one_round(round_, hyper))
        counts[proportional] = len(calls)
    planned = np.asarray(local.planned_steps(
        make_round(algorithm, 2).spec, TRAIN.count[SELECTED], np.where(OUTCOME == OK, STEPS_DONE, 0)
    ))  # fmt: skip
    working = np.sort(planned[OUTCOME == OK])[::-1]
    expected = sum(int(working[i]) for i in range(0, len(working), 2))  # each chunk's first
    max_steps = WORK.static_steps(MAX_COUNT)
    assert counts[True] == expected
    assert counts[False] == 5 * max_steps  # 9 slots in 5 chunks, every step computed
    assert counts[True] < counts[False] / 2
