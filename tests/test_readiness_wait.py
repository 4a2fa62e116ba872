"""A synchronous round waits on the virtual clock until a client is ready, never trains nobody
in a round of zero length, and a run in which no client will ever be ready is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.schema import ConfigError
from fedjax_het.system import policy as policies
from fedjax_het.system.availability import Availability
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import OK, never_ready, schedule, select_among_ready
from fedjax_het.system.setup import System
from fedjax_het.training.plan import _check_someone_ready

N = 4
LATE_WINDOWS = [np.array([[100.0, 400.0], [600.0, 900.0]])]  # nobody is ready before 100 s


def profiles(intervals, trace=(0, 0, 0, 0)) -> ClientProfiles:
    full = lambda v: jnp.full((N,), v, jnp.float32)
    return ClientProfiles(
        step_time=full(1.0), down_mean=full(1e6), down_std=full(0.0), up_mean=full(1e6),
        up_std=full(0.0), trace=jnp.asarray(trace, jnp.int32), dropout=full(0.0),
        availability=Availability.from_intervals(intervals, 1000.0),
    )  # fmt: skip


def plan(clients, policy, rounds=3):
    return jax.device_get(schedule(
        clients, policy, select_among_ready(N, 2), rounds=rounds, cohort_size=2,
        steps_needed=10, payload_down=0.0, payload_up=0.0, key=jax.random.key(0),
    ))  # fmt: skip


def test_a_round_with_nobody_ready_waits_for_the_first_ready_client():
    rows = plan(profiles(LATE_WINDOWS), policies.wait_all(overhead=2.0))
    # Round 0 starts when the windows open (less the 2 s overhead), not at 0 with nobody.
    np.testing.assert_allclose(rows.start[0], 98.0, atol=1e-4)
    assert (rows.outcome == OK).all()
    np.testing.assert_allclose(rows.duration, 12.0, atol=1e-4)  # 2 s overhead + 10 steps of 1 s
    np.testing.assert_allclose(rows.clock, [110.0, 122.0, 134.0], atol=1e-3)
    # The same rows as a run whose policy starts its clock there.
    started_late = plan(profiles(LATE_WINDOWS), policies.wait_all(overhead=2.0, start=98.0))
    np.testing.assert_allclose(rows.clock, started_late.clock, atol=1e-3)
    np.testing.assert_array_equal(rows.selected, started_late.selected)


def test_a_round_ending_outside_every_window_waits_for_the_next_one():
    rows = plan(profiles(LATE_WINDOWS), policies.wait_all(overhead=2.0), rounds=30)
    starts = rows.start + 2.0
    ready = lambda t: (100 <= t % 1000 < 400) | (600 <= t % 1000 < 900)
    assert all(ready(t) for t in starts), "every round starts with someone ready"
    assert (rows.outcome == OK).sum(-1).min() >= 1


def test_a_selection_blind_to_availability_does_not_wait():
    rows = plan(profiles(LATE_WINDOWS), policies.wait_all(overhead=2.0, availability_aware=False))
    assert rows.start[0] == 0.0 and not (rows.outcome[0] == OK).any()


def test_a_run_in_which_nobody_is_ever_ready_is_refused_in_one_line():
    nobody = profiles([np.zeros((0, 2))])
    policy = policies.wait_all(overhead=2.0)
    rows = plan(nobody, policy)
    assert never_ready(nobody, policy, rows) == 0
    assert never_ready(profiles(LATE_WINDOWS), policy, plan(profiles(LATE_WINDOWS), policy)) is None
    with pytest.raises(ConfigError, match="no client is ever ready again from round 0 on"):
        _check_someone_ready(System(nobody, policy), rows)
