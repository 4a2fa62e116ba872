"""The asynchronous server: its event schedule and training from stale models.

Two references written here, independently of the scan:

- an event simulation in Python floats (a loop over task endings, one client
  per slot) of the server in ``fedjax_het.system.events``: the same arrivals,
  versions, clocks, failures and discards, exactly;
- float64 per-client training (``test_scaffold_feddyn``'s numpy SGD) of hand-built
  events with ragged clients, stale versions, the same client twice in one
  event and an event with an empty slot, for FedBuff and FedAsync: within
  rtol 1e-5, atol 1e-6 of the float32 engine, every event.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scaffold_feddyn as reference

from fedjax_het.algorithms.fedasync import fedasync
from fedjax_het.algorithms.fedbuff import fedbuff
from fedjax_het.algorithms.staleness import staleness_fn
from fedjax_het.engine import local
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.system import availability as avail
from fedjax_het.system import events
from fedjax_het.system.profiles import ClientProfiles

# ---- the event schedule against an event simulation -----------------------------------------

STEP_TIME = (1.03, 1.71, 2.93, 0.437, 13.17)  # seconds per step
STEPS = (1, 1, 1, 10, 1)  # client 3: 4.37 s a task; client 4: 13.17 s, too stale
READY = ((0.0, 7.0), (9.5, 30.0))  # client 2's trace, period 40 s: its task at 5.8 is lost at 7


def profiles(on_trace=2) -> ClientProfiles:
    n = len(STEP_TIME)
    traces = avail.Availability.from_intervals([[list(p) for p in READY]], 40.0)
    trace = np.full(n, avail.ALWAYS, np.int32)
    trace[on_trace] = 0
    inf = jnp.full(n, jnp.inf)
    return ClientProfiles(
        step_time=jnp.asarray(STEP_TIME, jnp.float32), down_mean=inf, down_std=jnp.zeros(n),
        up_mean=inf, up_std=jnp.zeros(n), trace=jnp.asarray(trace), dropout=jnp.zeros(n),
        availability=traces,
    )


def ready_interval(c, t):
    """``(ready now, end of the ready interval, next ready time)`` of client ``c`` at ``t``."""
    if c != 2:
        return True, math.inf, t
    cycle, pos = divmod(t, 40.0)
    for start, end in READY:
        if start <= pos < end:
            return True, cycle * 40.0 + end, t
        if pos < start:
            return False, None, cycle * 40.0 + start
    return False, None, (cycle + 1) * 40.0 + READY[0][0]


def simulate(events_wanted, buffer_size, max_staleness):
    """Every client always holds a slot (concurrency = N): a finished client starts again at once
    (or when it is next ready) from the version current at that moment."""
    work = [s * t for s, t in zip(STEPS, STEP_TIME)]
    version, rows, buffer, dropped, discarded = 0, [], [], 0, 0
    # per client: (end time, kind, version started); kind "ok", "lost" or "wait"
    running = {c: (0.0, "wait", 0) for c in range(len(work))}
    while len(rows) < events_wanted:
        c = min(running, key=lambda k: (running[k][0], k))
        t, kind, v = running[c]
        ties = [k for k in running if k != c and running[k][0] == t and running[k][1] != "wait"]
        assert kind == "wait" or not ties, "the hand-built profile must not tie"
        if kind == "ok":
            if version - v <= max_staleness:
                buffer.append((c, v, t))
            else:
                discarded += 1
        elif kind == "lost":
            dropped += 1
        if len(buffer) == buffer_size:
            rows.append((buffer, t, dropped, discarded))
            buffer, dropped, discarded, version = [], 0, 0, version + 1
        ready, until, next_ready = ready_interval(c, t)
        if not ready:
            running[c] = (next_ready, "wait", version)
        elif t + work[c] > until:
            running[c] = (until, "lost", version)
        else:
            running[c] = (t + work[c], "ok", version)
    return rows


@pytest.mark.parametrize("buffer_size,max_staleness", [(1, 2), (2, 1), (3, 3)])
def test_event_schedule_matches_an_event_simulation(buffer_size, max_staleness):
    server = events.async_server(
        concurrency=5, buffer_size=buffer_size, max_staleness=max_staleness, on_unavailable="lost"
    )
    e = 12
    got = jax.jit(functools.partial(
        events.async_schedule, events=e, payload_down=0.0, payload_up=0.0
    ))(profiles(), server, steps_needed=jnp.asarray(STEPS), key=jax.random.key(3))
    want = simulate(e, buffer_size, max_staleness)
    assert bool(got.valid.all())
    for i, (buffer, clock, dropped, discarded) in enumerate(want):
        assert [(int(c), int(v)) for c, v in zip(got.selected[i], got.version[i])] == [
            (c, v) for c, v, _ in buffer
        ], f"event {i}"
        np.testing.assert_allclose(got.arrival[i], [a for _, _, a in buffer], rtol=1e-6)
        np.testing.assert_allclose(got.clock[i], clock, rtol=1e-6)
        assert (int(got.dropped[i]), int(got.discarded[i])) == (dropped, discarded), f"event {i}"
    assert int(got.discarded.sum()) > 0 and int(got.dropped.sum()) > 0  # both paths were taken
    assert set(np.asarray(events.staleness(got)).ravel()) <= set(range(max_staleness + 1))


def test_event_schedule_counts_tasks_and_concurrency_and_stalls_when_nobody_is_ever_ready():
    server = events.async_server(concurrency=3, buffer_size=2, max_staleness=4)
    p = profiles().replace(down_mean=jnp.full(5, 1e6), up_mean=jnp.full(5, 2e6))
    s = events.async_schedule(p, server, events=6, steps_needed=jnp.asarray(STEPS),
                              payload_down=1e6, payload_up=1e6, key=jax.random.key(0))
    assert np.all(np.asarray(s.in_flight) <= 3)
    assert int(s.dispatched.sum()) == int(s.valid.sum() + s.dropped.sum() + s.discarded.sum()) + int(
        s.in_flight[-1])
    np.testing.assert_allclose(float(s.bytes_up.sum()), 1e6 * float(s.valid.sum() + s.discarded.sum()))
    never = p.replace(trace=jnp.zeros(5, jnp.int32), availability=avail.Availability.from_intervals(
        [[]], 10.0))
    stalled = events.async_schedule(never, server, events=2, steps_needed=1, payload_down=0.0,
                                    payload_up=0.0, key=jax.random.key(0))
    assert bool(stalled.stalled.all()) and not bool(stalled.valid.any())


def test_event_schedule_is_independent_of_jit_and_vmap_over_seeds():
    server = events.async_server(concurrency=4, buffer_size=2, max_staleness=3)
    p = profiles().replace(dropout=jnp.full(5, 0.3))
    make = functools.partial(events.async_schedule, p, server, events=5, steps_needed=jnp.asarray(STEPS),
                             payload_down=0.0, payload_up=0.0)
    keys = jax.random.split(jax.random.key(1), 3)
    batched = jax.jit(jax.vmap(lambda k: make(key=k)))(keys)
    for i in range(3):
        one = make(key=keys[i])
        jax.tree.map(lambda a, b, i=i: np.testing.assert_array_equal(a[i], b), batched, one)


@pytest.mark.parametrize("options,message", [
    ({"concurrency": 4, "buffer_size": 5, "max_staleness": 2}, "buffer_size \\(5\\) must not exceed"),
    ({"concurrency": 4, "buffer_size": 2, "max_staleness": 0}, "max_staleness must be an integer >= 1"),
    ({"concurrency": 0, "buffer_size": 1, "max_staleness": 1}, "concurrency must be an integer >= 1"),
    ({"concurrency": 2, "buffer_size": 1, "max_staleness": 1, "on_unavailable": "x"}, "on_unavailable"),
    ({"concurrency": 2, "buffer_size": 1, "max_staleness": 1, "start": -1.0}, "start must be"),
])
def test_bad_server_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message):
        events.async_server(**options)


def test_concurrency_above_the_population_is_refused():
    with pytest.raises(ValueError, match="concurrency \\(6\\) must not exceed the number of clients"):
        events.async_schedule(profiles(), events.async_server(concurrency=6, buffer_size=1,
                              max_staleness=1), events=1, steps_needed=1, payload_down=0.0,
                              payload_up=0.0, key=jax.random.key(0))


# ---- training from stale versions against float64 references -----------------------------------

K, DEPTH = 3, 3  # buffer size; ring depth (max staleness 2)
# Hand-built events: (clients, versions, tasks, valid). Event 2 holds client 2 twice (two tasks)
# and a version two events old; event 3 has an empty slot.
EVENTS = (
    ((2, 0, 3), (0, 0, 0), (0, 1, 2), (True, True, True)),
    ((1, 3, 2), (0, 0, 1), (3, 4, 5), (True, True, True)),
    ((2, 2, 0), (0, 2, 1), (6, 7, 8), (True, True, True)),
    ((3, 1, 0), (2, 3, 3), (9, 10, 0), (True, True, False)),
)


def event_rows() -> events.EventSchedule:
    clients, versions, tasks, valid = (np.asarray(x) for x in zip(*EVENTS))
    e = len(EVENTS)
    zeros = np.zeros(e, np.float32)
    return events.EventSchedule(
        selected=jnp.asarray(clients, jnp.int32), valid=jnp.asarray(valid),
        outcome=jnp.asarray(np.where(valid, 0, 4), jnp.int32),
        steps_done=jnp.full(clients.shape, local.NO_STEP_LIMIT, jnp.int32),
        version=jnp.asarray(versions, jnp.int32), task=jnp.asarray(tasks, jnp.int32),
        arrival=jnp.zeros(clients.shape), start=zeros, duration=zeros, clock=zeros,
        dropped=zeros.astype(np.int32), discarded=zeros.astype(np.int32),
        dispatched=zeros.astype(np.int32), in_flight=zeros.astype(np.int32), bytes_down=zeros,
        bytes_up=zeros, stalled=jnp.asarray(~valid.all(axis=1)),
    )


@functools.cache
def stale_round(algorithm, chunk, precision="float32") -> Round:
    base = reference.make_round(algorithm, chunk=chunk, precision=precision)
    return Round(base.model, algorithm, base.sampler, base.spec, chunk=chunk, weighting="uniform",
                 ring_depth=DEPTH)


@functools.partial(reference.fast_jit, static_argnums=0)
def run_events(round_, state, rows, hyper, train, key):
    def one(state, inputs):
        e, row = inputs
        return round_.step(state, e, hyper, train, key, row)

    return jax.lax.scan(one, state, (jnp.arange(len(EVENTS), dtype=jnp.int32), rows))


@functools.partial(reference.fast_jit, static_argnums=(0, 1))
def start_state(algorithm, model, hyper, key):
    return init_state(model, algorithm, reference.N, hyper, key, ring_depth=DEPTH)


def run_engine(algorithm, hyper, chunk=2, precision="float32"):
    key = jax.random.key(5)
    round_ = stale_round(algorithm, chunk, precision)
    train = device_split(reference.make_store())
    hyper = algorithm.hyper(hyper, dtype=local.hyper_dtype(precision))
    state = start_state(algorithm, round_.model, hyper, key)
    x0 = reference.as64(algorithm.global_params(state.server_state))
    models = []
    for e in range(len(EVENTS)):  # one event at a time, to compare every model
        row = jax.tree.map(lambda a, e=e: a[e : e + 1], event_rows())
        state, metrics = single_event(round_, state, e, row, hyper, train, key)
        models.append(reference.as64(algorithm.global_params(state.server_state)))
    return round_, train, x0, models, metrics


@functools.partial(reference.fast_jit, static_argnums=0)
def single_event(round_, state, e, rows, hyper, train, key):
    row = jax.tree.map(lambda a: a[0], rows)
    return round_.step(state, e, hyper, train, key, row)


def reference_run(round_, train, x0, weight, base, mix):
    """float64 events: each valid slot trains from its version's model; ``base`` "start" or
    "current" measures its update; ``mix(x, Σ s u / K)`` is the server step."""
    store, key = reference.make_store(), jax.random.key(5)
    xs, out = [x0], []
    for e, (clients, versions, tasks, valid) in enumerate(EVENTS):
        row = jax.tree.map(lambda a, e=e: a[e], event_rows())
        _, task_rows = round_.cohort(jnp.int32(e), train, key, row)
        indices, steps = jax.device_get(reference.engine_batches(round_.spec, task_rows, train))
        total, count = reference.zeros_like(x0), 0
        for slot, (k, v, ok) in enumerate(zip(clients, versions, valid)):
            if not ok:
                continue
            data = reference.client_rows(store, round_.spec, k, indices[slot], steps[slot],
                                         local.NO_STEP_LIMIT)
            start = xs[v]
            trained, _ = reference.reference_sgd(start, data, reference.CLIENT_LR, reference.zeros_like)
            against = start if base == "start" else xs[e]
            s = weight(e - v)
            total = jax.tree.map(lambda t, a, b, s=s: t + s * (a - b), total, against, trained)
            count += 1
        norm = max(count, 1)
        step = jax.tree.map(lambda t, n=norm: t / n, total)
        xs.append(mix(xs[e], step))
        out.append(xs[-1])
    return out


def check_fedbuff(precision="float32", **tolerance):
    """FedBuff's engine on the hand-built stale events against the float64 reference."""
    algorithm = fedbuff(client_lr=reference.CLIENT_LR)
    round_, train, x0, models, metrics = run_engine(algorithm, {"server_lr": 0.8}, 2, precision)
    s = lambda tau: 1 / math.sqrt(1 + tau)
    want = reference_run(round_, train, x0, s, "start",
                         lambda x, d: jax.tree.map(lambda a, b: a - 0.8 * b, x, d))
    for got, expected in zip(models, want, strict=True):
        reference.tree_close(got, expected, **tolerance)
    return metrics


def test_fedbuff_on_stale_versions_matches_float64_reference():
    metrics = check_fedbuff()
    # the last event: versions 2 and 3 at event 3, and an empty slot
    assert (float(metrics["staleness_max"]), float(metrics["staleness_mean"])) == (1.0, 0.5)
    assert int(metrics["participants"]) == 2


def test_fedasync_mixes_models_against_float64_reference():
    algorithm = fedasync(client_lr=reference.CLIENT_LR, staleness="hinge", a=2.0, b=0.0)
    round_, train, x0, models, _ = run_engine(algorithm, {"alpha": 0.6})
    s = staleness_fn("hinge", a=2.0, b=0.0)
    want = reference_run(round_, train, x0, lambda tau: float(s(tau)), "current",
                         lambda x, d: jax.tree.map(lambda a, b: a - 0.6 * b, x, d))
    for got, expected in zip(models, want):
        reference.tree_close(got, expected)


def test_stale_training_is_bitwise_independent_of_the_chunk_size():
    algorithm = fedbuff(client_lr=reference.CLIENT_LR)
    train = device_split(reference.make_store())
    hyper, key = algorithm.hyper(), jax.random.key(2)
    finals = []
    for chunk in (2, 3):
        round_ = stale_round(algorithm, chunk)
        state = start_state(algorithm, round_.model, hyper, key)
        state, _ = run_events(round_, state, event_rows(), hyper, train, key)
        finals.append(jax.device_get(state))
    jax.tree.map(np.testing.assert_array_equal, *finals)


def test_staleness_functions_follow_fedasync():
    tau = jnp.arange(6)
    np.testing.assert_allclose(staleness_fn("constant")(tau), 1.0)
    np.testing.assert_allclose(staleness_fn("polynomial", a=0.5)(tau), 1 / np.sqrt(1 + np.arange(6)),
                               rtol=1e-6)
    np.testing.assert_allclose(staleness_fn("hinge", a=10.0, b=4.0)(tau),
                               [1, 1, 1, 1, 1, 1 / 11], rtol=1e-6)
    with pytest.raises(ValueError, match="staleness must be one of"):
        staleness_fn("linear")
    with pytest.raises(ValueError, match="alpha must lie in \\(0, 1\\]"):
        fedasync().hyper({"alpha": 0.0})
    with pytest.raises(ValueError, match="alpha must lie in"):
        fedasync(alpha=1.5)
