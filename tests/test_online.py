"""Schedules computed inside the training loop: learned selection and FreezeFL's freezing."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms.freezefl import depth_masks, freeze_objective, freezefl
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.engine import round as round_lib
from fedjax_het.engine.algorithm import masked_mean
from fedjax_het.engine.hooks import Freezing, attach
from fedjax_het.sampling import power_of_choice, uniform
from fedjax_het.system import setup
from fedjax_het.system.flhetbench import participation_counts
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.sampler import ClientRecord
from fedjax_het.system.schedule import OK, select_among_ready
from fedjax_het.training import freeze_pricing, simulate
from fedjax_het.training.options import run_options

N, M = 12, 4
DATA = leaf_synthetic(num_clients=N, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
MODEL = models.mlp(DATA.example_shape, DATA.num_classes, hidden=(8,))  # Dense_0, Dense_1
WORK = LocalWork(batch_size=5, epochs=3)
COMMON = {"rounds": 4, "eval_every": 2, "work": WORK, "hyper": {"client_lr": 0.1}, "progress": False}
LAYER_BYTES = {"Dense_0": (6 * 8 + 8) * 4, "Dense_1": (8 * 3 + 3) * 4}


def system(*, kind="wait_all", bandwidth=1e3) -> setup.System:
    profiles = setup.profiles_from_options(
        N, devices="lognormal", step_time=0.1, step_time_sigma=0.8, bandwidth=bandwidth,
        availability="bernoulli", availability_p=0.7, dropout=0.1,
    )
    return setup.System(profiles, setup.policy_from_options(kind=kind, deadline=4.0))


def forced_freezing(depth: int, probe_share: float):
    """FedAvg with layer-wise aggregation whose clients all freeze ``depth`` layers."""
    rule = Freezing(probe_share, depth_masks, lambda *_: jnp.int32(depth))
    return attach(fedavg(aggregator=masked_mean(), name=f"frozen{depth}"), rule)


def run(algorithm, sys, **kw):
    return simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=algorithm,
            sampler=uniform(N, M),
            system=sys,
            **{**COMMON, **kw},
        ),
    )


def initial_state() -> round_lib.RunState:
    """The state every run with seed 0 starts from."""
    return round_lib.init_state(MODEL, fedavg(), N, fedavg().hyper(), jax.random.key(0))


def test_a_frozen_layer_is_bit_identical_and_its_bytes_are_not_counted():
    sys = system()
    frozen = run(forced_freezing(1, probe_share=0.0), sys)
    start = initial_state()
    np.testing.assert_array_equal(
        frozen.params["Dense_0"]["kernel"], start.server_state.params["Dense_0"]["kernel"]
    )
    assert not np.array_equal(
        frozen.params["Dense_1"]["kernel"], start.server_state.params["Dense_1"]["kernel"]
    )
    s = frozen.schedule
    ok = np.asarray(s.outcome) == OK
    assert ok.any()
    np.testing.assert_array_equal(np.asarray(s.bytes_up)[ok], LAYER_BYTES["Dense_1"])
    full = sum(LAYER_BYTES.values())
    np.testing.assert_array_equal(np.asarray(s.bytes_down)[ok], full)


def test_depth_counts_layers_from_the_input_in_the_forward_order_not_the_sorted_one():
    """A char LSTM's params come back sorted (``Dense_0``, the output, first); freezing one
    layer must freeze ``Embed_0``, the input side, and train the output layer."""
    from fedjax_het.data.federated import FederatedData

    rng = np.random.default_rng(0)
    chars = [rng.integers(0, 9, (6, 5)).astype(np.int32) for _ in range(N)]
    data = FederatedData.from_client_arrays(
        chars, [rng.integers(0, 9, 6).astype(np.int32) for _ in range(N)],
        test_xs=chars, test_ys=[np.zeros(6, np.int32)] * N, num_classes=9,
    )  # fmt: skip
    lstm = models.char_lstm((5,), 9)
    start = round_lib.init_state(lstm, fedavg(), N, fedavg().hyper(), jax.random.key(0))
    start = start.server_state.params  # what the run starts from (seed 0)
    assert models.layer_order(lstm, start, data.train.x[:1])[0] == "Embed_0"
    frozen = simulate.run(
        data,
        *run_options(
            model=lstm,
            algorithm=forced_freezing(1, probe_share=0.0),
            sampler=uniform(N, M),
            system=system(),
            devices=1,
            **COMMON,
        ),
    )  # fmt: skip  (one device: the char models' flax scan does not run under shard_map)
    # Frozen: still the start (to float32 rounding: the run initialises inside jit, this
    # test outside, and the embedding's normal draw may differ in the last bit); trained, it
    # moves by about 1e-2 in these 4 rounds, as does the output layer here.
    embedding = frozen.params["Embed_0"]["embedding"]
    np.testing.assert_allclose(embedding, start["Embed_0"]["embedding"], rtol=0, atol=1e-7)
    assert np.abs(frozen.params["Dense_0"]["kernel"] - start["Dense_0"]["kernel"]).max() > 1e-3


def test_the_probe_trains_every_layer_then_the_mask_applies():
    sys = system()
    # One round. Probe = all the work: every layer trains, but Dense_0 is not uploaded;
    # Dense_1 is FedAvg's, since layer-wise and plain means agree where everyone trained.
    one = {"rounds": 1, "eval_every": 1}
    probe_all = run(forced_freezing(1, probe_share=1.0), sys, **one)
    plain = run(forced_freezing(0, probe_share=1.0), sys, **one)
    np.testing.assert_array_equal(probe_all.schedule.outcome, plain.schedule.outcome)
    np.testing.assert_allclose(
        probe_all.params["Dense_1"]["kernel"], plain.params["Dense_1"]["kernel"], rtol=1e-6
    )
    start = initial_state()
    np.testing.assert_array_equal(
        probe_all.params["Dense_0"]["kernel"], start.server_state.params["Dense_0"]["kernel"]
    )
    # Frozen from step 0, Dense_0's gradient path no longer moves: Dense_1 trains differently.
    no_probe = run(forced_freezing(1, probe_share=0.0), sys, **one)
    assert not np.allclose(no_probe.params["Dense_1"]["kernel"], plain.params["Dense_1"]["kernel"])


def test_the_in_loop_schedule_is_the_precomputed_one():
    sys = system(kind="deadline")
    among_ready = select_among_ready(N, M)
    online = run(fedavg(), sys, select=lambda key, r, ready, record: among_ready(key, r, ready))
    offline = run(fedavg(), sys)
    for got, want in zip(jax.tree.leaves(online.schedule), jax.tree.leaves(offline.schedule)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(jax.tree.leaves(online.params), jax.tree.leaves(offline.params)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert online.summary["virtual_s"] == offline.summary["virtual_s"]
    # Always-available clients: with no select given, the online loop selects with the sampler,
    # as the precomputed plan does; freezing nothing (depth 0) changes nothing.
    always = setup.System(setup.profiles_from_options(N, devices="lognormal", bandwidth=1e3),
                          setup.policy_from_options())
    frozen_nothing = run(forced_freezing(0, probe_share=0.5), always)
    plain = run(fedavg(aggregator=masked_mean()), always)
    for got, want in zip(jax.tree.leaves(frozen_nothing.schedule), jax.tree.leaves(plain.schedule)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(jax.tree.leaves(frozen_nothing.params), jax.tree.leaves(plain.params)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_freeze_objective_by_hand():
    importance, seconds = jnp.array([1.0, 2.0, 3.0]), jnp.array([10.0, 8.0, 5.0])
    # d=0: 6 (6/10)^2 = 2.16; d=1: 5 (6/8)^2 = 2.8125; d=2: 3 (on time: no penalty).
    np.testing.assert_allclose(
        freeze_objective(importance, seconds, jnp.float32(6), jnp.float32(2)),
        [2.16, 2.8125, 3.0], rtol=1e-6,
    )
    no_deadline = freeze_objective(importance, seconds, jnp.float32(jnp.nan), jnp.float32(2))
    np.testing.assert_allclose(no_deadline, [6.0, 5.0, 3.0])
    assert int(jnp.argmax(freeze_objective(importance, seconds, 6.0, 0.0))) == 0  # beta 0: FedAvg


def test_freezefl_freezes_on_a_slow_uplink_and_saves_upload_bytes():
    slow = system(bandwidth=20.0)  # uploading the whole model takes ~16 s, the compute ~1 s
    frozen = run(freezefl(beta=4.0, epochs=3), slow)
    plain = run(fedavg(aggregator=masked_mean()), slow)
    ok = np.asarray(frozen.schedule.outcome) == OK
    sent = np.asarray(frozen.schedule.bytes_up)[ok]
    assert set(np.unique(sent)) <= {LAYER_BYTES["Dense_1"], sum(LAYER_BYTES.values())}
    assert np.any(sent == LAYER_BYTES["Dense_1"])  # somebody froze Dense_0
    assert frozen.summary["bytes_up"] < plain.summary["bytes_up"]
    with pytest.raises(ValueError, match="give run a system"):
        simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=freezefl(),
                sampler=uniform(N, M),
                **COMMON,
            ),
        )


def test_power_of_choice_learns_from_the_record():
    sys = system()
    history = run(fedavg(), sys, select=power_of_choice(N, M, candidates=8))
    s = history.schedule
    valid = np.asarray(s.valid)
    # Round 0: no client observed, every candidate ties; later rounds prefer high losses.
    assert valid.any()
    counts = np.asarray(participation_counts(s, N, successful=False))
    assert counts.sum() == valid.sum()
    ids = np.asarray(s.selected)[valid]
    assert len(set(np.asarray(s.selected)[0][valid[0]].tolist())) == valid[0].sum()  # distinct
    assert ids.min() >= 0 and ids.max() < N


def test_frozen_steps_cost_what_xla_counts_for_the_layers_still_training():
    spec = simulate.local_spec(MODEL, fedavg(), DATA, WORK)
    masks = depth_masks(MODEL.init(jax.random.key(0)))
    costs = freeze_pricing.step_costs(spec, fedavg().hyper(), round_lib.device_split(DATA.train), masks)
    assert costs[0] == 1.0 and 0 < costs[1] < 1  # Dense_0's gradient and backward are gone
    # A wait_all round of always-ready clients with free transfers lasts the slowest step total.
    profiles = setup.profiles_from_options(N, step_time=0.5, bandwidth=1e12)
    sys = setup.System(profiles, setup.policy_from_options(kind="wait_all"))
    frozen = run(forced_freezing(1, probe_share=0.0), sys, rounds=1, eval_every=1)
    row = jax.tree.map(lambda a: np.asarray(a)[0], frozen.schedule)
    steps = simulate.steps_needed(spec, DATA.train.count)[row.selected]
    np.testing.assert_allclose(row.duration, (steps * 0.5 * costs[1]).max(), rtol=1e-4)


def test_power_of_choice_takes_the_highest_losses_among_ready_candidates():
    record = ClientRecord.empty(6).replace(
        loss=jnp.array([0.1, 5.0, jnp.nan, 3.0, 9.0, 0.4])
    )
    ready = jnp.array([True, True, True, True, False, True])  # client 4: highest loss, not ready
    ids, valid = power_of_choice(6, 3, candidates=6)(jax.random.key(1), 0, ready, record)
    # Never observed (2) first, then by loss among the ready: 1 (5.0), 3 (3.0).
    assert ids.tolist() == [2, 1, 3] and valid.all()
    few = jnp.zeros(6, bool).at[0].set(True)
    ids, valid = power_of_choice(6, 3, candidates=4)(jax.random.key(1), 0, few, record)
    assert ids[0] == 0 and valid.tolist() == [True, False, False]


def test_both_schedules_price_a_scaffold_round_alike_and_log_round_zero_alike(tmp_path):
    # SCAFFOLD sends its control variate down and its change up: twice the model each way,
    # on the planned schedule and on the in-loop one (one pricing, training.costs).
    from fedjax_het.algorithms import scaffold

    sys = system(kind="deadline")
    among_ready = select_among_ready(N, M)
    select = lambda key, r, ready, record: among_ready(key, r, ready)
    online = run(scaffold(), sys, select=select, out_dir=tmp_path / "online")
    offline = run(scaffold(), sys, out_dir=tmp_path / "offline")
    for got, want in zip(jax.tree.leaves(online.schedule), jax.tree.leaves(offline.schedule)):
        np.testing.assert_array_equal(got, want)
    model_bytes = sum(LAYER_BYTES.values())
    ok = np.asarray(offline.schedule.outcome) == OK
    assert np.all(np.asarray(offline.schedule.bytes_up)[ok] == 2 * model_bytes)
    first = [
        json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
        for name in ("online", "offline")
    ]
    assert first[0]["round"] == first[1]["round"] == 0
    assert first[0].keys() == first[1].keys() and first[0]["virtual_s"] == 0.0


def test_an_in_loop_run_no_client_will_ever_join_is_refused_before_its_directory(tmp_path):
    from fedjax_het.schema import ConfigError
    from fedjax_het.system.availability import Availability

    full = lambda v: jnp.full((N,), v, jnp.float32)
    nobody = ClientProfiles(
        step_time=full(0.1), down_mean=full(1e3), down_std=full(0.0), up_mean=full(1e3),
        up_std=full(0.0), trace=jnp.zeros((N,), jnp.int32), dropout=full(0.0),
        availability=Availability.from_intervals([np.zeros((0, 2))], 1000.0),
    )
    never = setup.System(nobody, setup.policy_from_options(kind="deadline", deadline=4.0))
    select = power_of_choice(N, M, candidates=8)
    with pytest.raises(ConfigError, match="no client is ever ready again from round 0"):
        run(fedavg(), never, select=select, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()

