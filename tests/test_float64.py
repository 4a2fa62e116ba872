"""float64 runs end to end: ``precision="float64"`` (``engine.precision``) under ``jax_enable_x64``.

Without 64-bit JAX the option is refused in one line before anything is
built. With it, every shipped algorithm trains, aggregates and evaluates in
float64 (params, optimizer and client states, hyperparameters), with device
heterogeneity, a learned selection, FreezeFL's online schedule and a sweep;
and SCAFFOLD and FedDyn match their float64 per-client sequential references
(``tests/test_scaffold_feddyn.py``) to rtol 1e-12, atol 1e-13, where the
float32 engine gets rtol 1e-5, atol 1e-6. x64 is switched on per test
(``jax.enable_x64``), so the rest of the suite stays float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_async as stale
import test_scaffold_feddyn as reference

import fedjax_het
from fedjax_het import algorithms, models
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms.freezefl import freezefl
from fedjax_het.data import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.front.config import ConfigError, build, load
from fedjax_het.sampling import power_of_choice, uniform
from fedjax_het.system import setup
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

NUM_CLIENTS = 6
DATA = leaf_synthetic(num_clients=NUM_CLIENTS, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
MODEL = models.mlp(DATA.example_shape, DATA.num_classes, hidden=(8,))
WORK = LocalWork(batch_size=5, epochs=1.5)
COMMON = {"rounds": 4, "eval_every": 2, "work": WORK, "progress": False, "devices": 1}
F64 = jnp.dtype(jnp.float64)
# FetchSGD's default sketch (5 x 10,000 values) is larger than this 83-parameter model: its
# upload would miss every deadline here.
SMALL = {"fetchsgd": lambda: algorithms.fetchsgd(rows=2, cols=20, k=0.2)}


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def system(kind: str = "deadline") -> setup.System:
    profiles = setup.profiles_from_options(
        NUM_CLIENTS, devices="lognormal", step_time=0.1, dropout=0.2, bandwidth=1e4,
        availability="bernoulli", availability_p=0.8,
    )  # fmt: skip
    return setup.System(
        profiles, setup.policy_from_options(kind=kind, deadline=1.0, on_late="partial")
    )


def float_dtypes(tree) -> set[jnp.dtype]:
    return {x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_float64_without_x64_is_refused_in_one_line():
    with pytest.raises(ValueError, match="jax_enable_x64") as err:
        simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=fedavg(),
                sampler=uniform(NUM_CLIENTS, 3),
                precision="float64",
                **COMMON,
            ),
        )
    assert "\n" not in str(err.value)


def test_a_config_asking_for_float64_switches_x64_on():
    assert not jax.config.jax_enable_x64
    try:
        experiment = build(load(None, ["engine.precision='float64'", "rounds=2"]))
        assert jax.config.jax_enable_x64
        assert experiment.run_kwargs()["precision"] == "float64"
    finally:
        jax.config.update("jax_enable_x64", False)
    with pytest.raises(ConfigError, match="engine.precision"):
        build(load(None, ["engine.precision='float16'"]))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(algorithms.__all__) - {"optimizers"}))
def test_every_algorithm_runs_in_float64(x64, name):
    history = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=SMALL.get(name, getattr(algorithms, name))(),
            sampler=uniform(NUM_CLIENTS, 3),
            precision="float64",
            system=system(),
            **COMMON,
        ),
    )  # fmt: skip
    assert float_dtypes(history.params) == {F64}
    assert np.isfinite(history.metrics[-1]["test_loss"])
    assert history.metrics[-1]["test_loss"] != history.metrics[0]["test_loss"]  # it trained


def test_float64_is_float32_without_its_rounding(x64):
    """The float64 run follows the float32 run's schedule and stays close to it, but not equal."""
    runs = [
        simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=fedavg(),
                sampler=uniform(NUM_CLIENTS, 3),
                precision=p,
                system=system(),
                **COMMON,
            ),
        )
        for p in ("float32", "float64")
    ]  # fmt: skip
    (low, high) = runs
    for name in ("ok", "late", "dropped"):
        np.testing.assert_array_equal(low.round_metrics[name], high.round_metrics[name])
    gap = jax.tree.map(lambda a, b: np.max(np.abs(np.asarray(a, np.float64) - b)), low.params,
                       high.params)  # fmt: skip
    assert 0 < max(jax.tree.leaves(gap)) < 1e-4


@pytest.mark.slow
def test_online_schedule_learned_selection_and_sweep_in_float64(x64):
    frozen = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=freezefl(),
            sampler=uniform(NUM_CLIENTS, 3),
            precision="float64",
            system=system("wait_all"),
            **COMMON,
        ),
    )  # fmt: skip
    chosen = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=fedavg(),
            sampler=uniform(NUM_CLIENTS, 3),
            precision="float64",
            system=system(),
            select=power_of_choice(NUM_CLIENTS, 3, candidates=5),
            **COMMON,
        ),
    )  # fmt: skip
    cells = fedjax_het.sweep(
        DATA, MODEL, fedavg(), uniform(NUM_CLIENTS, 3), seeds=(0, 1), systems=[system()] * 2,
        precision="float64", **COMMON,
    )  # fmt: skip
    for history in (frozen, chosen, *cells):
        assert float_dtypes(history.params) == {F64}
        assert np.isfinite(history.metrics[-1]["test_loss"])


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_float64_engine_matches_the_float64_reference_to_1e_12(x64, algorithm):
    check = getattr(reference, f"check_{algorithm}")
    check(precision="float64", rtol=1e-12, atol=1e-13)


def test_the_reference_check_can_fail_in_float64(x64):
    """The same check at float32 precision misses 1e-12: the tolerance above means something."""
    with pytest.raises(AssertionError):
        reference.check_scaffold(precision="float32", rtol=1e-12, atol=1e-13)


def test_stale_updates_match_the_float64_reference_to_1e_12(x64):
    """FedBuff's staleness weights computed in the run's dtype: float64 events to 1e-12."""
    stale.check_fedbuff(precision="float64", rtol=1e-12, atol=1e-13)


def test_the_stale_reference_check_can_fail_in_float64(x64):
    with pytest.raises(AssertionError):
        stale.check_fedbuff(precision="float32", rtol=1e-12, atol=1e-13)
