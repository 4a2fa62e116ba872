"""The cohort sharded over devices: results independent of the device count.

``tests/conftest.py`` gives the suite four CPU devices
(``--xla_force_host_platform_device_count=4``). A cohort of 7 slots does not
divide over 2 or 4 devices, and chunks of 2 run inside each device.

Tolerance: each client's computation is the same program on every device
count, so one round's per-client updates, states and stats are bitwise
equal; only the cross-device sum of the aggregate changes its order. Over
rounds that rounding feeds back through the global model, so whole runs agree
to ``|a - b| <= RTOL * max|b| + ATOL`` with RTOL = 1e-5, ATOL = 1e-6
(measured on these runs: at most 6e-7 absolute on params of size ~1).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import rng
from fedjax_het.engine.cohort import CLIENTS, client_mesh, run_cohort
from fedjax_het.engine.local import ClientTask, local_update
from fedjax_het.front import config
from fedjax_het.front.sweep import sweep
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

RTOL, ATOL = 1e-5, 1e-6
TINY = [
    'data.name="synthetic"', "data.num_clients=12", "sampler.clients_per_round=7",
    "model.name=logistic_regression", "rounds=4", "eval_every=2", "engine.chunk=2",
]
SYSTEM = ['system.devices="lognormal"', 'policy.kind="deadline"', "policy.deadline=30.0"]


def experiment(*sets: str) -> config.Experiment:
    return config.build(config.load(None, [*TINY, *sets]))


def run(e: config.Experiment, devices: int, **kwargs) -> simulate.History:
    kwargs = {**e.run_kwargs(), "devices": devices, **kwargs}
    return simulate.run(
        e.data,
        *run_options(
            model=e.model,
            algorithm=e.algorithm,
            sampler=e.sampler,
            **kwargs,
            progress=False,
        ),
    )


def close(a, b) -> None:
    """Every leaf within the stated tolerance."""

    def check(x, y):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = np.nanmax(np.abs(y)) if y.size else 0.0
        np.testing.assert_allclose(x, y, rtol=0, atol=RTOL * scale + ATOL)

    jax.tree.map(check, jax.device_get(a), jax.device_get(b))


def test_four_cpu_devices_are_there():
    assert jax.device_count() == 4


def test_one_round_is_bitwise_per_client_on_1_2_and_4_devices():
    """SCAFFOLD (a client state), 7 slots, chunk 2, ragged clients, a step limit, a weight-0 slot."""
    e = experiment('algorithm.name="scaffold"')
    setup = simulate.Setup.build(
        e.data, e.model, e.algorithm, e.sampler, rounds=1, work=e.work, hyper=e.hyper,
        eval_every=1, chunk=2, unroll=1, weighting="examples", eval_batch_size=64, devices=1,
    )
    key = rng.seed_key(3)
    state = setup.init(key)
    broadcast = e.algorithm.broadcast(state.server_state)
    ids = jnp.asarray([0, 3, 5, 7, 8, 10, 11], jnp.int32)
    tasks = ClientTask(
        ids, jnp.asarray([1.0, 2.0, 0.0, 4.0, 1.0, 3.0, 2.0]),
        jnp.asarray([2**30, 1, 2**30, 2**30, 2, 2**30, 2**30], jnp.int32),
        rng.client_keys(key, jnp.int32(0), "train", ids),
    )
    states = setup.round.store.gather(state.client_states, ids)
    client_fn = functools.partial(local_update, setup.round.spec, setup.hyper, broadcast,
                                  data=setup.train)

    def cohort(devices):
        program = functools.partial(
            run_cohort, client_fn, aggregator=e.algorithm.aggregator, chunk=2,
            mesh=client_mesh(devices),
        )
        return jax.jit(program)(states, tasks)

    sums, new_states, stats = cohort(1)
    for devices in (2, 4):
        other_sums, other_states, other_stats = cohort(devices)
        jax.tree.map(np.testing.assert_array_equal, other_states, new_states)
        jax.tree.map(np.testing.assert_array_equal, other_stats, stats)
        close(other_sums, sums)


@pytest.mark.parametrize("devices", [2, 4])
def test_runs_match_one_device(devices):
    """A stateful algorithm under a deadline system (partial work, dropped clients)."""
    e = experiment('algorithm.name="scaffold"', *SYSTEM)
    one, many = run(e, 1), run(e, devices)
    assert (one.summary["devices"], many.summary["devices"]) == (1, devices)
    close(many.params, one.params)
    close(many.round_metrics, one.round_metrics)
    close(jax.tree.map(lambda s: s[:12], many.state.client_states), one.state.client_states)
    close([m["test_accuracy"] for m in many.metrics], [m["test_accuracy"] for m in one.metrics])


def test_client_states_are_sharded_by_client():
    e = experiment('algorithm.name="scaffold"')
    history = run(e, 4)
    for leaf in jax.tree.leaves(history.state.client_states):
        assert leaf.shape[0] == 12  # 12 clients divide over 4 devices
        assert leaf.sharding.spec == jax.sharding.PartitionSpec(CLIENTS)
        assert {shard.data.shape[0] for shard in leaf.addressable_shards} == {3}
    uneven = config.build(config.load(None, [*TINY, 'algorithm.name="scaffold"',
                                             "data.num_clients=10"]))
    padded = run(uneven, 4).state.client_states
    assert {leaf.shape[0] for leaf in jax.tree.leaves(padded)} == {12}  # 10 rows padded to 12


def test_in_loop_selection_and_host_states_match_one_device():
    """Power-of-choice (schedule computed in the loop) with client states on the host."""
    e = experiment('algorithm.name="scaffold"', *SYSTEM, 'selection.name="power_of_choice"',
                   "selection.candidates=10")
    one = run(e, 1, client_state="host")
    many = run(e, 4, client_state="host")
    assert many.summary["devices"] == 4
    assert many.summary["client_state_placement"] == "host"
    close(many.params, one.params)
    close(many.round_metrics, one.round_metrics)


def test_sweep_matches_one_device():
    e = experiment()
    kwargs = {"rounds": 4, "work": e.work, "hyper": e.hyper, "eval_every": 2, "chunk": 2,
              "seeds": (0, 1), "progress": False}
    one = sweep(e.data, e.model, e.algorithm, e.sampler, devices=1, **kwargs)
    many = sweep(e.data, e.model, e.algorithm, e.sampler, devices=4, **kwargs)
    for a, b in zip(many, one):
        close(a.params, b.params)
        assert a.summary["devices"] == 4


def test_device_count_is_checked():
    with pytest.raises(ValueError, match="devices must be between 1 and the 4 devices"):
        client_mesh(5)
    with pytest.raises(config.ConfigError, match="engine.devices must be >= 0"):
        experiment("engine.devices=-1")
    assert client_mesh(1) is None and client_mesh(None).size == 4
