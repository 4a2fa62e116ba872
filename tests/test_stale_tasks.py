"""Stale tasks in the synchronous server (FLHetBench's BiasPrompt+ server, notes §4.4).

The schedule's stale arrivals are checked against a round loop in Python
floats written here: a late client keeps working, its update arrives in the
first later round whose deadline covers its completion, from its origin
round's model, if at most ``max_staleness`` rounds later, at most
``cohort_size`` of them a round (earliest first), and the round lasts until
its last stale arrival. The selection is read from the engine's rows; every
time is recomputed. Training from the origin round's model is the ring's
(``test_async``); here a run checks it ends to end with BiasPrompt+.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import biasprompt_plus
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform
from fedjax_het.system import policy as policies
from fedjax_het.system import profiles as prof
from fedjax_het.system import schedule as scheduling
from fedjax_het.system import setup
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

N, M, DEADLINE, OVERHEAD = 8, 3, 10.0, 1.0
STEP_TIME = np.array([1.0, 2.5, 4.0, 6.5, 9.0, 13.0, 21.0, 35.0])  # one task = 3 steps


def stale_schedule(max_staleness, rounds=20):
    clients = prof.uniform_profiles(N).replace(step_time=jnp.asarray(STEP_TIME, jnp.float32))
    policy = policies.deadline(DEADLINE, overhead=OVERHEAD, max_staleness=max_staleness)
    return scheduling.schedule(
        clients, policy, scheduling.select_among_ready(N, M), rounds=rounds, cohort_size=M,
        steps_needed=3, payload_down=0.0, payload_up=0.0, key=jax.random.key(4),
    )


def reference(selected, max_staleness):
    """Per round: the stale arrivals ``[(client, origin)]`` and the round's duration."""
    work = 3 * STEP_TIME
    start, pending, out = 0.0, [], []
    for r, ids in enumerate(selected):
        t0 = start + OVERHEAD
        finish = [work[k] for k in ids]
        ok = [f for f in finish if f <= DEADLINE]
        end = max(ok) if ok else DEADLINE
        arrived = sorted((a, k, o) for a, k, o in pending if a <= t0 + DEADLINE)
        usable = [(a, k, o) for a, k, o in arrived if r - o <= max_staleness][:M]
        pending = [p for p in pending if p not in usable and not (
            p in arrived and r - p[2] > max_staleness) and r - p[2] < max_staleness]
        duration = OVERHEAD + end
        if usable:
            duration = max(duration, max(a for a, _, _ in usable) - start)
        out.append(([(k, o) for _, k, o in usable], duration))
        pending += [(t0 + f, k, r) for k, f in zip(ids, finish) if f > DEADLINE]
        start += duration
    return out


@pytest.mark.parametrize("max_staleness", [1, 2, 4])
def test_stale_arrivals_match_a_round_loop(max_staleness):
    s = jax.device_get(stale_schedule(max_staleness))
    assert s.selected.shape[1] == 2 * M  # the cohort's slots, then the stale arrivals'
    want = reference(s.selected[:, :M].tolist(), max_staleness)
    for r, (arrivals, duration) in enumerate(want):
        valid = s.valid[r, M:]
        got = sorted(zip(s.selected[r, M:][valid].tolist(), s.version[r, M:][valid].tolist()))
        assert got == sorted(arrivals), f"round {r}"
        np.testing.assert_allclose(s.duration[r], duration, rtol=1e-6, err_msg=f"round {r}")
        assert np.all(s.outcome[r, M:][valid] == scheduling.OK)
    assert sum(len(a) for a, _ in want) >= 3  # stale arrivals happened
    ages = np.arange(len(want))[:, None] - s.version[:, M:]
    assert np.all(ages[s.valid[:, M:]] >= 1) and np.all(ages[s.valid[:, M:]] <= max_staleness)


def test_without_stale_tasks_late_work_is_lost_and_rows_keep_their_width():
    s = stale_schedule(0)
    assert s.selected.shape[1] == M and bool(jnp.all(s.version == jnp.arange(20)[:, None]))


def test_bad_stale_options_are_one_line_errors():
    with pytest.raises(ValueError, match="max_staleness must be an integer >= 0"):
        policies.deadline(10.0, max_staleness=-1)
    with pytest.raises(ValueError, match="needs policy.kind = 'deadline'"):
        setup.policy_from_options(kind="wait_all", max_staleness=2)


def test_biasprompt_plus_trains_stale_arrivals_from_their_round():
    data = leaf_synthetic(num_clients=12, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
    model = models.logistic_regression(data.example_shape, data.num_classes)
    clients = prof.uniform_profiles(12).replace(
        step_time=jnp.asarray(np.geomspace(0.05, 3.0, 12), jnp.float32))
    system = setup.System(clients, policies.deadline(2.0, max_staleness=3))
    h = simulate.run(
        data,
        *run_options(
            model=model,
            algorithm=biasprompt_plus(),
            sampler=uniform(12, 4),
            rounds=12,
            work=LocalWork(batch_size=5, epochs=1),
            system=system,
            eval_every=6,
            progress=False,
        ),
    )
    staleness = h.round_metrics["staleness_max"]
    assert staleness.max() >= 1 and staleness.max() <= 3
    assert np.isfinite(h.summary["final_test_loss"])
