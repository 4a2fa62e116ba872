"""How whole schedules compile (system/schedule.py, ``schedule_jit``): XLA:CPU's older fusion
emitters compile faster to the same bits as the level alone, and an XLA that does not know
an option compiles with the level alone instead of failing."""

from __future__ import annotations

import jax
import numpy as np

from fedjax_het import rng
from fedjax_het.front import config
from fedjax_het.system import schedule
from fedjax_het.training import simulate


def plan(experiment):
    spec = simulate.local_spec(experiment.model, experiment.algorithm, experiment.data,
                               experiment.work)
    return jax.device_get(simulate.plan_run(
        experiment.system, experiment.data, spec, experiment.sampler, rounds=12,
        key=rng.seed_key(3)))


EXPERIMENT = config.build(config.load(None, [
    'data.name="synthetic"', "data.num_clients=30", "sampler.clients_per_round=6",
    "system.devices=flash", "system.availability=strict", "policy.kind=deadline",
    "policy.deadline=60.0", "policy.on_late=partial",
]))


def test_the_schedule_options_give_the_level_alones_bits(monkeypatch):
    default = plan(EXPERIMENT)
    monkeypatch.setattr(schedule, "SCHEDULE_COMPILE", schedule.SCHEDULE_LEVEL)
    level = plan(EXPERIMENT)
    jax.tree.map(np.testing.assert_array_equal, default, level)
    assert np.asarray(default.valid).any()


def test_an_option_xla_does_not_know_falls_back_to_the_level(monkeypatch):
    monkeypatch.setattr(schedule, "SCHEDULE_COMPILE",
                        {**schedule.SCHEDULE_LEVEL, "xla_no_such_option_here": True})
    double = schedule.schedule_jit(lambda x: 2 * x)
    assert float(double(np.float32(3.0))) == 6.0
    assert len(double._jitted) == 1  # the level alone from now on
    assert np.asarray(plan(EXPERIMENT).valid).any()  # a whole schedule, planned all the same
