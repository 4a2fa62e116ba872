"""A learned selection run from a config, as the selection tests check it (``test_rbcs_f``,
``test_freezefl_selection``): 8 synthetic clients, 3 a round, every round waits for all."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_het.front import config
from fedjax_het.training import simulate

SMALL = ('data.name="synthetic"', "data.num_clients=8", "sampler.clients_per_round=3",
         "policy.kind=wait_all")


def build(*overrides: str) -> config.Experiment:
    return config.build(config.load(None, [*SMALL, *overrides]))


def run_with_distinct_cohorts(experiment: config.Experiment) -> simulate.History:
    """Runs ``experiment``; every round selected 3 distinct valid clients and it evaluated."""
    history = simulate.run(
        experiment.data,
        *experiment.options(progress=False),
    )
    selected, valid = np.asarray(history.schedule.selected), np.asarray(history.schedule.valid)
    for ids, ok in zip(selected, valid):
        assert ok.sum() == 3 and len(set(ids[ok].tolist())) == 3
    assert np.isfinite(history.summary["final_test_accuracy"])
    return history


def assert_refused_in_one_line(key: str, *overrides: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        build(*overrides)
    assert key in str(err.value) and "\n" not in str(err.value)
