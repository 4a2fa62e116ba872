"""Client-state stores: HostStore is bit-identical to DeviceStore, and placement is planned.

The stateful algorithm is defined here: FedAvg whose clients keep a round
counter and the running mean of their trained params, start local training
halfway between the global model and that mean (so the gathered rows shape the
global model), and are evaluated on the mean (personalised evaluation gathers
too). Both stores run the same rounds (cohorts of 4 with chunk 3, a client
never selected; cohorts of 3 with chunk 2, a step limit and a weight-0 client)
and must agree with ``array_equal``: tolerance 0, rows are copied, not computed
(evaluations, compiled separately, to float32 rounding).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import LocalContext
from fedjax_het.engine.client_store import (
    ON_DEVICE,
    DeviceStore,
    HostStore,
    Memory,
    available_memory,
    plan_client_state,
)
from fedjax_het.engine.hooks import Personalized, attach
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.front import config
from fedjax_het.front.sweep import sweep
from fedjax_het.system.sampler import Sampler
from fedjax_het.training.loop import train_loop
from fedjax_het.training.options import run_options
from fedjax_het.training.programs import Setup
from fedjax_het.training.simulate import run

F, C, N = 5, 3, 6
SIZES = (1, 6, 17, 30, 9, 12)
WORK = LocalWork(batch_size=4, epochs=1.5)
MODEL = models.logistic_regression((F,), C)
COHORTS = ((0, 2, 3, 1), (2, 4, 0, 3), (3, 0, 1, 2))  # round r: COHORTS[r % 3]; 5 never selected
ROW_BYTES = 4 + 4 * (F * C + C)  # int32 counter + float32 mean of (w, b)


def client_start(model, broadcast, state, batches, hyper, key):
    del model, batches, hyper, key
    return jax.tree.map(lambda g, m: 0.5 * (g + m), broadcast, state["mean"]), state


def client_finalize(params, ctx: LocalContext, hyper):
    del hyper
    state = ctx.client_state
    count = state["count"] + 1
    mean = jax.tree.map(
        lambda m, p: m + (p - m) / count.astype(p.dtype), state["mean"], params
    )
    update = jax.tree.map(lambda s, p: s - p, ctx.start, params)
    return update, {"count": count, "mean": mean}


STATEFUL = attach(
    fedavg(
        client_init=lambda params: {"count": jnp.zeros((), jnp.int32), "mean": params},
        client_start=client_start,
        client_finalize=client_finalize,
        name="running_mean",
    ),
    Personalized(lambda server_state, state: state["mean"]),
)


def make_data(seed: int = 0) -> FederatedData:
    gen = np.random.default_rng(seed)
    xs = [gen.normal(k - 2.5, 1.0, (n, F)).astype(np.float32) for k, n in enumerate(SIZES)]
    ys = [gen.integers(0, C, n).astype(np.int32) for n in SIZES]
    test_xs = [gen.normal(k - 2.5, 1.0, (4, F)).astype(np.float32) for k in range(N)]
    test_ys = [gen.integers(0, C, 4).astype(np.int32) for _ in range(N)]
    return FederatedData.from_client_arrays(xs, ys, test_xs=test_xs, test_ys=test_ys,
                                            num_classes=C)


DATA = make_data()
SAMPLER = Sampler(
    select=lambda key, r: jnp.asarray(COHORTS, jnp.int32)[r % len(COHORTS)],
    num_clients=N, cohort_size=4,
)


def both(tree_a, tree_b) -> None:
    """Every leaf bitwise equal."""
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(tree_a), jax.device_get(tree_b))


def train(client_state: str, rounds: int = 4):
    setup = Setup.build(
        DATA, MODEL, STATEFUL, SAMPLER, rounds=rounds, work=WORK, hyper={"client_lr": 0.1},
        eval_every=2, chunk=3, unroll=1, weighting="examples", eval_batch_size=64,
        client_state=client_state,
    )
    key = rng.seed_key(0)
    block, evaluate = setup.programs(key)
    evaluations = []
    state = train_loop(
        setup.init(key), rounds=rounds, eval_every=2, block=block, evaluate=evaluate,
        plans=None, on_eval=lambda done, metrics, ev: evaluations.append((metrics, ev)),
        progress=False,
    ).state
    rows = setup.round.store.read(state.client_states, np.arange(N))
    return setup, state, rows, evaluations


def test_host_store_is_bitwise_device_store_over_rounds():
    """Four rounds (two blocks), cohorts of 4 in chunks of 3, personalised evaluation."""
    dev_setup, dev_state, dev_rows, dev_evals = train("device")
    host_setup, host_state, host_rows, host_evals = train("host")
    assert isinstance(dev_setup.round.store, DeviceStore)
    assert isinstance(host_setup.round.store, HostStore)
    both(dev_state.server_state, host_state.server_state)
    both(dev_rows, host_rows)
    both([m for m, _ in dev_evals], [m for m, _ in host_evals])  # per-round training metrics
    # Evaluations (personal ones included) to float32 rounding: XLA fuses the on-device gather
    # into the evaluation's arithmetic, while host rows arrive whole from a callback, so the
    # two evaluation programs may round one loss sum differently (measured: 1 ulp).
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=0),
        [ev for _, ev in dev_evals], [ev for _, ev in host_evals],
    )
    assert "personal_correct" in host_evals[-1][1]
    # Client 5 was never selected: it reads as its initial row and the host holds no row for it.
    initial = STATEFUL.client_init(MODEL.init(rng.stream(rng.seed_key(0), "init")))
    both(jax.tree.map(lambda r: r[5], host_rows), initial)
    assert host_setup.round.store.rows_held(N) == 5
    np.testing.assert_array_equal(host_rows["count"], [4, 3, 4, 4, 1, 0])


ROUNDS = (  # (ids, step limits, weights): client 3 is dropped, client 0 cut to 1 step
    ((1, 3, 0), (local.NO_STEP_LIMIT, local.NO_STEP_LIMIT, 1), (6.0, 0.0, 1.0)),
    ((0, 1, 2), (local.NO_STEP_LIMIT,) * 3, (1.0, 6.0, 17.0)),
)


def train_rounds(store):
    spec = local.LocalSpec(MODEL, STATEFUL, WORK, WORK.static_steps(30), 30)
    round_ = Round(MODEL, STATEFUL, SAMPLER, spec, chunk=2, store=store)
    train = device_split(DATA.train)
    hyper, key = STATEFUL.hyper({"client_lr": 0.1}), rng.seed_key(1)
    state = jax.jit(functools.partial(init_state, MODEL, STATEFUL, N, store=store))(hyper, key)
    step = jax.jit(round_.train_cohort)
    for r, (ids, limits, weights) in enumerate(ROUNDS):
        ids = jnp.asarray(ids, jnp.int32)
        tasks = local.ClientTask(
            ids, jnp.asarray(weights, jnp.float32), jnp.asarray(limits, jnp.int32),
            rng.client_keys(key, jnp.int32(r), "train", ids),
        )
        state, _, _ = step(state, ids, tasks, hyper, train)
    return state, store.read(state.client_states, np.arange(N))


def test_dropped_client_keeps_its_state_in_both_stores():
    """Cohorts of 3 in chunks of 2; client 3 trains at weight 0 and must keep its initial row."""
    host = HostStore()
    dev_state, dev_rows = train_rounds(ON_DEVICE)
    host_state, host_rows = train_rounds(host)
    both(dev_state.server_state, host_state.server_state)
    both(dev_rows, host_rows)
    initial = STATEFUL.client_init(MODEL.init(rng.stream(rng.seed_key(1), "init")))
    for k in (3, 4, 5):
        both(jax.tree.map(lambda r, k=k: r[k], host_rows), initial)
    np.testing.assert_array_equal(host_rows["count"], [2, 2, 1, 0, 0, 0])
    assert host.rows_held(N) == 3  # clients 0, 1, 2; nothing for the dropped or unselected


@pytest.mark.parametrize("store", [DeviceStore(), HostStore()], ids=["device", "host"])
def test_unkept_slot_never_overwrites_a_kept_row(store):
    """An invalid schedule slot may repeat a kept client's id; only the kept row is written."""
    held = store.init(jnp.zeros(2), 3)
    held = store.scatter(held, jnp.array([1, 1]), jnp.array([[1.0, 1], [2, 2]]),
                         jnp.array([True, False]))
    np.testing.assert_array_equal(store.read(held, [0, 1, 2]), [[0, 0], [1, 1], [0, 0]])


def test_host_store_refuses_a_stale_state():
    store = HostStore()
    old = store.init(jnp.zeros(2), 3)
    store.scatter(old, jnp.array([0]), jnp.ones((1, 2)), jnp.array([True]))
    with pytest.raises(Exception, match="only the newest state"):
        jax.block_until_ready(store.gather(old, jnp.array([0])))


def big_state(floats: int):
    return fedavg(client_init=lambda params: jnp.zeros((floats,), jnp.float32))


@pytest.mark.parametrize(
    "placement, device_free, host, expected",
    [
        ("auto", 10_000, 10**6, "device"),  # 6 x 400 B = 2.4 kB fits half of 10 kB
        ("auto", 4_000, 10**6, "host"),  # 2.4 kB is more than half of 4 kB
        ("device", 4_000, 0, "device"),  # asked for, and it fits
        ("host", 10**6, 1_000, "host"),  # at most 2 rows x 400 B = 800 B
    ],
)
def test_placement_for_given_budgets(placement, device_free, host, expected):
    p = plan_client_state(
        big_state(100), MODEL, num_clients=N, rounds=1, slots=2, placement=placement,
        memory=lambda: Memory(device_free, host),
    )
    assert (p.placement, p.row_bytes, p.device_bytes, p.max_rows, p.host_bytes) == (
        expected, 400, 2_400, 2, 800
    )
    assert type(p.store()) is (HostStore if expected == "host" else DeviceStore)


def test_a_state_that_fits_nowhere_is_refused_with_its_bytes():
    with pytest.raises(ValueError) as error:
        plan_client_state(
            big_state(1_000_000), MODEL, num_clients=100_000, rounds=100, slots=10,
            memory=lambda: Memory(device_free=80 * 10**9, host_available=2 * 10**9),
        )
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "client state needs 400.0 GB (100000 clients x 4.0 MB) on the device, or 4.0 GB on the "
        "host for the at most 1000 clients that 100 rounds of 10 slots write; the device has "
        "80.0 GB free and the host 2.0 GB"
    )
    for placement in ("device", "host"):
        with pytest.raises(ValueError, match=f"engine.client_state = '{placement}' does not fit"):
            plan_client_state(
                big_state(1_000_000), MODEL, num_clients=100_000, rounds=100, slots=10,
                placement=placement, memory=lambda: Memory(80 * 10**9, 2 * 10**9),
            )
    with pytest.raises(ValueError, match="client_state must be one of auto, device, host"):
        plan_client_state(big_state(1), MODEL, num_clients=N, rounds=1, slots=1, placement="disk")


def test_a_cpu_device_has_the_hosts_memory():
    free = available_memory()
    assert jax.default_backend() == "cpu"
    assert free.device_free == free.host_available > 0


def test_stateless_algorithms_cost_nothing_and_query_nothing():
    def no_query():
        raise AssertionError("a stateless algorithm must not query memory")

    p = plan_client_state(
        fedavg(), MODEL, num_clients=10**9, rounds=10**6, slots=10**4, placement="host",
        memory=no_query,
    )
    assert (p.placement, p.device_bytes, p.held_bytes(p.store())) == ("none", 0, 0)


def test_summary_reports_placement_and_bytes():
    common = {"rounds": 3, "work": WORK, "eval_every": 3, "chunk": 3, "progress": False}
    host = run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=STATEFUL,
            sampler=SAMPLER,
            client_state="host",
            **common,
        ),
    )
    assert host.summary["client_state_placement"] == "host"
    assert host.summary["client_state_bytes"] == 5 * ROW_BYTES  # clients 0-4 were written
    device = run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=STATEFUL,
            sampler=SAMPLER,
            client_state="device",
            **common,
        ),
    )
    assert device.summary["client_state_placement"] == "device"
    assert device.summary["client_state_bytes"] == N * ROW_BYTES
    both(host.params, device.params)
    stateless = run(DATA, *run_options(model=MODEL, algorithm=fedavg(), sampler=SAMPLER, **common))
    summary = stateless.summary
    assert (summary["client_state_placement"], summary["client_state_bytes"]) == ("none", 0)


def test_config_and_sweep_check_the_placement():
    with pytest.raises(config.ConfigError, match="engine.client_state must be one of"):
        config.build(config.load(overrides=["engine.client_state='disk'"]))
    with pytest.raises(ValueError, match="sweep keeps client states on the device"):
        sweep(DATA, MODEL, STATEFUL, SAMPLER, rounds=1, work=WORK, client_state="host",
              progress=False)
