"""Sub-models on the simulated schedule: a narrower client computes and sends less.

Expected shares are derived here by hand from the models' shapes (a dense layer's
multiply-adds are ``fan_in x units``, a convolution's ``kh kw c_in c_out`` per output
pixel; the bytes are the kept params at 4 bytes each), not read from the code under test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms.fedrolex import fedrolex
from fedjax_het.algorithms.fjord import fjord
from fedjax_het.algorithms.heterofl import heterofl
from fedjax_het.algorithms.submodels import level_flops, unit_layout
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.engine.hooks import SubModel
from fedjax_het.sampling import uniform
from fedjax_het.system import setup
from fedjax_het.system.schedule import LATE, OK, select_among_ready
from fedjax_het.training import costs, online, simulate
from fedjax_het.training.options import run_options

N, M, D_IN, H, C = 8, 8, 16, 32, 3
DATA = leaf_synthetic(num_clients=N, alpha=0.5, beta=0.5, num_features=D_IN, num_classes=C)
MODEL = models.mlp(DATA.example_shape, C, hidden=(H,))
WORK = LocalWork(batch_size=5, epochs=2)
STEP = 0.1


def mlp_flops(units: int) -> int:
    """Multiply-adds of the 16-units-3 MLP's forward pass, per example."""
    return D_IN * units + units * C


def mlp_params(units: int) -> int:
    return D_IN * units + units + units * C + C


def plan(algorithm, system, rounds=1):
    spec = simulate.local_spec(MODEL, algorithm, DATA, WORK)
    return simulate.plan_run(system, DATA, spec, uniform(N, M), rounds=rounds,
                             key=jax.random.key(0))


def free_transfers(kind="wait_all", deadline=1.0) -> setup.System:
    profiles = setup.profiles_from_options(N, step_time=STEP, bandwidth=np.inf)
    return setup.System(profiles, setup.policy_from_options(kind=kind, deadline=deadline))


def steps() -> np.ndarray:
    spec = simulate.local_spec(MODEL, fedavg(), DATA, WORK)
    return simulate.steps_needed(spec, DATA.train.count)


def test_a_quarter_width_client_takes_its_flops_share_of_the_time():
    """wait_all, free transfers: each client finishes after steps x step_time x share, with
    share = the kept multiply-adds, ceil(0.25 x 32) = 8 hidden units of 32."""
    share = mlp_flops(8) / mlp_flops(H)
    full = plan(heterofl(widths=(1.0, 0.25), client_levels=(0,) * N), free_transfers())
    quarter = plan(heterofl(widths=(1.0, 0.25), client_levels=(1,) * N), free_transfers())
    row_full, row_quarter = (jax.tree.map(lambda a: np.asarray(a)[0], p) for p in (full, quarter))
    np.testing.assert_array_equal(row_full.selected, row_quarter.selected)
    want = steps()[row_full.selected] * STEP
    np.testing.assert_allclose(row_full.finish, want, rtol=1e-6)
    np.testing.assert_allclose(row_quarter.finish, want * share, rtol=1e-6)
    np.testing.assert_allclose(row_quarter.duration / row_full.duration, share, rtol=1e-6)


def test_a_narrow_client_meets_a_deadline_the_full_model_misses():
    levels = tuple(k % 2 for k in range(N))  # odd clients at width 0.25
    share = np.where(np.asarray(levels) == 1, mlp_flops(8) / mlp_flops(H), 1.0)
    seconds = steps() * STEP * share
    deadline = float(np.median(steps() * STEP))
    row = jax.tree.map(lambda a: np.asarray(a)[0],
                       plan(fedrolex(widths=(1.0, 0.25), client_levels=levels),
                            free_transfers("deadline", deadline)))
    ids = row.selected
    np.testing.assert_array_equal(row.outcome == OK, seconds[ids] <= deadline)
    np.testing.assert_array_equal(row.outcome == LATE, seconds[ids] > deadline)
    saved = (steps()[ids] * STEP > deadline) & (row.outcome == OK)
    assert saved.any()  # a client the full model would have made late


def test_bytes_are_the_kept_params_both_ways():
    profiles = setup.profiles_from_options(N, step_time=STEP, bandwidth=1e3)
    system = setup.System(profiles, setup.policy_from_options())
    levels = tuple(k % 3 for k in range(N))
    row = jax.tree.map(lambda a: np.asarray(a)[0],
                       plan(heterofl(widths=(1.0, 0.5, 0.25), client_levels=levels), system))
    units = np.asarray([H, 16, 8])[np.asarray(levels)[row.selected]]
    want = 4.0 * np.asarray([mlp_params(u) for u in units])
    np.testing.assert_array_equal(row.bytes_down, want)
    np.testing.assert_array_equal(row.bytes_up, want)
    # Each finish: transfers at 1e3 B/s, then its steps at its FLOPs share.
    flops = np.asarray([mlp_flops(u) / mlp_flops(H) for u in units])
    np.testing.assert_allclose(
        row.finish, 2 * want / 1e3 + steps()[row.selected] * STEP * flops, rtol=1e-5
    )


def test_fjord_pays_the_mean_share_of_its_draws():
    """A client of p_max = 0.5 in P = (1, 0.5, 0.25) draws 0.5 or 0.25 each step; it uploads
    F_0.5."""
    algorithm = fjord(widths=(1.0, 0.5, 0.25), client_levels=(0, 1, 2) * 2 + (0, 1))
    x = jax.ShapeDtypeStruct((1, D_IN), jnp.float32)
    costs = algorithm.hook(SubModel).costs(N, MODEL, x)
    share = {u: mlp_flops(u) / mlp_flops(H) for u in (H, 16, 8)}
    np.testing.assert_allclose(
        costs.compute[:3],
        [np.mean(list(share.values())), (share[16] + share[8]) / 2, share[8]], rtol=1e-12,
    )
    np.testing.assert_allclose(costs.transfer[:3], [mlp_params(u) / mlp_params(H)
                                                    for u in (H, 16, 8)], rtol=1e-12)
    np.testing.assert_array_equal(costs.work_kept[:3], [1.0, 0.5, 0.25])


def test_the_cnn_and_the_lstm_shares_from_their_shapes():
    cnn = models.femnist_cnn((28, 28, 1), 10)
    x = jax.ShapeDtypeStruct((1, 28, 28, 1), jnp.float32)
    layout = unit_layout(cnn, jax.eval_shape(cnn.init, jax.random.key(0)), x, (1.0, 0.5))
    convs = lambda c0, c1: 28 * 28 * 25 * c0 + 14 * 14 * 25 * c0 * c1
    denses = lambda c1, d: 7 * 7 * c1 * d + d * 10
    full, half = convs(32, 64) + denses(64, 2048), convs(16, 32) + denses(32, 1024)
    np.testing.assert_allclose(level_flops(cnn, layout, x), [1.0, half / full], rtol=1e-12)
    lstm = models.char_lstm((5,), 20, embed=8, hidden=6, layers=2)
    x = jax.ShapeDtypeStruct((1, 5), jnp.int32)
    layout = unit_layout(lstm, jax.eval_shape(lstm.init, jax.random.key(0)), x, (1.0, 0.5))
    # 4 gates a step, 5 steps (the embedding's 8 units are hidden units too, 4 kept); the
    # output layer reads the last step only; the embedding is a lookup, no product.
    cells = lambda e, h: 5 * 4 * ((e * h + h * h) + (h * h + h * h))
    np.testing.assert_allclose(level_flops(lstm, layout, x),
                               [1.0, (cells(4, 3) + 3 * 20) / (cells(8, 6) + 6 * 20)], rtol=1e-12)


def test_xla_counts_a_model_built_at_that_width_close_to_the_share():
    """The elementwise work the share leaves out is a few percent of this MLP."""
    wide, narrow = (models.mlp((64,), 10, hidden=(h,)) for h in (64, 16))

    def xla_flops(model):
        params = model.init(jax.random.key(0))
        apply = lambda p, x: model.apply(p, x, train=False, key=None)
        analysis = jax.jit(apply).lower(params, jnp.zeros((8, 64))).compile().cost_analysis()
        return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]

    x = jax.ShapeDtypeStruct((1, 64), jnp.float32)
    layout = unit_layout(wide, jax.eval_shape(wide.init, jax.random.key(0)), x, (1.0, 0.25))
    assert level_flops(wide, layout, x)[1] == pytest.approx(
        xla_flops(narrow) / xla_flops(wide), rel=0.05)


def test_width_one_everywhere_is_fedavgs_schedule_bit_for_bit():
    profiles = setup.profiles_from_options(N, devices="lognormal", step_time=STEP,
                                           bandwidth=1e3, availability="bernoulli")
    system = setup.System(profiles, setup.policy_from_options(kind="deadline", deadline=3.0))
    plain = plan(fedavg(), system, rounds=2)
    for algorithm in (heterofl(widths=(1.0,)), fjord(widths=(1.0,))):
        for got, want in zip(jax.tree.leaves(plan(algorithm, system, rounds=2)),
                             jax.tree.leaves(plain)):
            np.testing.assert_array_equal(got, want)


def test_the_in_loop_schedule_prices_widths_as_the_plan_does():
    profiles = setup.profiles_from_options(N, devices="lognormal", step_time=STEP,
                                           bandwidth=1e3, availability="bernoulli")
    system = setup.System(profiles, setup.policy_from_options(kind="deadline", deadline=3.0))
    algorithm = heterofl(widths=(1.0, 0.5, 0.25), client_levels=tuple(k % 3 for k in range(N)))
    among_ready = select_among_ready(N, 4)
    common = {"rounds": 2, "eval_every": 2, "work": WORK, "progress": False}
    in_loop = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=algorithm,
            sampler=uniform(N, 4),
            system=system,
            **common,
            select=lambda key, r, ready, record: among_ready(key, r, ready),
        ),
    )
    planned = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=algorithm,
            sampler=uniform(N, 4),
            system=system,
            **common,
        ),
    )
    for got, want in zip(jax.tree.leaves(in_loop.schedule), jax.tree.leaves(planned.schedule)):
        np.testing.assert_array_equal(got, want)
    assert len(set(np.asarray(planned.schedule.bytes_down)[planned.schedule.valid])) > 1


def test_the_in_loop_record_keeps_each_clients_width_as_its_work():
    algorithm = fjord(widths=(1.0, 0.5, 0.25), client_levels=tuple(k % 3 for k in range(N)))
    built = simulate.Setup.build(
        DATA, MODEL, algorithm, uniform(N, M), rounds=1, work=WORK, hyper={}, eval_every=1,
        chunk=4, unroll=1, weighting="examples", eval_batch_size=64,
    )
    key = jax.random.key(1)
    inputs = online.RoundInputs(
        built.hyper, built.train, key, free_transfers().profiles,
        jnp.asarray(simulate.steps_needed(built.round.spec, DATA.train.count)), jnp.ones(1),
    )
    among_ready = select_among_ready(N, M)
    program = online.OnlineRound(built.round, setup.policy_from_options(),
                                 lambda key, r, ready, record: among_ready(key, r, ready))
    state = jax.jit(program.run_block)(program.init(built.init(key), N), jnp.arange(1), inputs)[0]
    np.testing.assert_array_equal(state.record.work_kept, [(1.0, 0.5, 0.25)[k % 3]
                                                           for k in range(N)])


def test_an_algorithm_without_costs_pays_the_full_model():
    assert costs.client_costs(fedavg(), MODEL, N, DATA.train.x) is None
