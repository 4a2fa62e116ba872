"""A sweep is many runs in one program: each cell trains what ``simulate.run`` trains alone."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.front.sweep import sweep
from fedjax_het.sampling import uniform
from fedjax_het.system import setup
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

NUM_CLIENTS = 12
DATA = leaf_synthetic(num_clients=NUM_CLIENTS, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
MODEL = models.logistic_regression(DATA.example_shape, DATA.num_classes)
ALGORITHM = fedavg()
SAMPLER = uniform(NUM_CLIENTS, 4)
WORK = LocalWork(batch_size=5, epochs=2)
COMMON = {"rounds": 6, "work": WORK, "eval_every": 3, "hyper": {"client_lr": 0.1}, "progress": False}


def system(seed: int, *, kind: str = "deadline", dropout: float = 0.0) -> setup.System:
    """Log-normal devices; a 1.5 s deadline with partial work, so steps and outcomes vary."""
    profiles = setup.profiles_from_options(
        NUM_CLIENTS, seed=seed, devices="lognormal", step_time=0.1, step_time_sigma=0.8,
        bandwidth=1e6, dropout=dropout,
    )
    policy = setup.policy_from_options(kind=kind, deadline=1.5, on_late="partial")
    return setup.System(profiles, policy)


def test_each_cell_trains_what_run_trains_alone():
    systems = [system(0), system(1, dropout=0.3)]
    cells = sweep(DATA, MODEL, ALGORITHM, SAMPLER, systems=systems, seeds=(3, 4), **COMMON)
    assert len(cells) == 4
    for i in (1, 2):  # (systems[0], seed 4) and (systems[1], seed 3)
        history = cells[i]
        alone = simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=ALGORITHM,
                sampler=SAMPLER,
                system=systems[i // 2],
                seed=(3, 4)[i % 2],
                **COMMON,
            ),
        )
        # The schedule has no floating-point reductions across cells: equal exactly.
        for got, want in zip(jax.tree.leaves(history.schedule), jax.tree.leaves(alone.schedule)):
            np.testing.assert_array_equal(got, want)
        # Training: batched matrix products may round differently; 1e-5 relative.
        for got, want in zip(jax.tree.leaves(history.params), jax.tree.leaves(alone.params)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert [e["round"] for e in history.metrics] == [e["round"] for e in alone.metrics]
        for key in ("virtual_s", "bytes_up", "examples_processed", "outcomes"):
            assert history.summary[key] == alone.summary[key]
        np.testing.assert_allclose(
            history.summary["final_test_accuracy"], alone.summary["final_test_accuracy"], atol=1e-6
        )


def test_the_cells_differ_where_their_settings_differ():
    cells = sweep(DATA, MODEL, ALGORITHM, SAMPLER, systems=[system(0), system(1, dropout=0.3)],
                  **COMMON)
    outcomes = [np.asarray(h.schedule.outcome) for h in cells]
    assert not np.array_equal(outcomes[0], outcomes[1])
    assert not np.allclose(jax.tree.leaves(cells[0].params)[0], jax.tree.leaves(cells[1].params)[0])


def test_seeds_only_without_a_system():
    cells = sweep(DATA, MODEL, ALGORITHM, SAMPLER, seeds=(0, 1), **COMMON)
    alone = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=ALGORITHM,
            sampler=SAMPLER,
            seed=1,
            **COMMON,
        ),
    )
    assert cells[1].schedule is None
    for got, want in zip(jax.tree.leaves(cells[1].params), jax.tree.leaves(alone.params)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_systems_that_cannot_share_a_program_are_refused():
    with pytest.raises(ValueError, match="policy kind"):
        sweep(DATA, MODEL, ALGORITHM, SAMPLER, systems=[system(0), system(0, kind="wait_all")],
              **COMMON)
    traced = setup.System(
        setup.profiles_from_options(NUM_CLIENTS, availability="bernoulli", seed=5),
        setup.policy_from_options(),
    )
    other = setup.System(
        setup.profiles_from_options(NUM_CLIENTS, availability="bernoulli", seed=6),
        setup.policy_from_options(),
    )
    with pytest.raises(ValueError, match="availability store"):
        sweep(DATA, MODEL, ALGORITHM, SAMPLER, systems=[traced, other], **COMMON)
    with pytest.raises(ValueError, match="seeds"):
        sweep(DATA, MODEL, ALGORITHM, SAMPLER, seeds=(), **COMMON)
