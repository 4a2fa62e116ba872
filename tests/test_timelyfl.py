"""TimelyFL: the depth rule, its run through the online schedule, and a float64 reference.

Eight always-available clients of 3 to 30 examples (ragged last batches) on a
three-layer MLP, a uniform 1 kB/s network and a deadline policy whose deadline
is the aggregation interval. Each client's step time is set so that its
full-model compute takes a chosen number of seconds, so that the clients span
every freeze depth and one fits at none. The expected depths are priced here
in float64 from the profile (transfers, steps at the engine's per-depth step
costs, upload of the layers trained), independently of ``online``'s pricing.
The reference round trains the clients one after another with numpy SGD
(closed-form gradients of the masked mean cross-entropy), the frozen layers
held, then takes the per-coordinate mean of the trained layers weighted by
example counts. Tolerance, float32 engine vs float64 reference: rtol 1e-5,
atol 1e-6.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.freezefl import depth_masks
from fedjax_het.algorithms.timelyfl import choose_depth, least_frozen_fitting, timelyfl
from fedjax_het.data import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import masked_mean
from fedjax_het.engine.hooks import Freezing
from fedjax_het.engine.round import device_split
from fedjax_het.sampling import uniform
from fedjax_het.system import setup
from fedjax_het.system.schedule import LATE, OK
from fedjax_het.training import freeze_pricing, simulate
from fedjax_het.training.options import run_options

F, C, HIDDEN = 5, 3, (6, 5)
SIZES = (3, 7, 12, 20, 9, 30, 5, 16)
N = len(SIZES)
FULL_COMPUTE = np.array([2.5, 40.0, 0.5, 9.0, 4.5, 1.5, 15.0, 5.5])  # seconds, every layer trained
INTERVAL, OVERHEAD, BANDWIDTH = 4.0, 1.0, 1e3
CLIENT_LR = 0.1
RTOL, ATOL = 1e-5, 1e-6
WORK = LocalWork(batch_size=4, epochs=1.5)
MODEL = models.mlp((F,), C, hidden=HIDDEN)  # Dense_0, Dense_1, Dense_2
TIMELYFL = timelyfl(interval=INTERVAL, client_lr=CLIENT_LR)


def make_data() -> FederatedData:
    gen = np.random.default_rng(0)
    xs = [gen.normal(k % 3 - 1.0, 1.0, (n, F)).astype(np.float32) for k, n in enumerate(SIZES)]
    ys = [gen.integers(0, C, n).astype(np.int32) for n in SIZES]
    return FederatedData.from_client_arrays(xs, ys, test_xs=xs, test_ys=ys, num_classes=C)


DATA = make_data()
SPEC = simulate.local_spec(MODEL, TIMELYFL, DATA, WORK)
STEPS = simulate.steps_needed(SPEC, DATA.train.count)


def make_system() -> setup.System:
    profiles = setup.profiles_from_options(N, bandwidth=BANDWIDTH)
    profiles = profiles.replace(step_time=jnp.asarray(FULL_COMPUTE / STEPS, jnp.float32))
    return setup.System(
        profiles, setup.policy_from_options(kind="deadline", deadline=INTERVAL, overhead=OVERHEAD)
    )


@functools.cache
def run(algorithm, cohort: int, rounds: int, chunk: int | None = None) -> simulate.History:
    return simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=algorithm,
            sampler=uniform(N, cohort),
            rounds=rounds,
            eval_every=rounds,
            work=WORK,
            system=make_system(),
            chunk=chunk,
            devices=1,
            progress=False,
        ),
    )  # fmt: skip


# ---- the float64 pricing and reference ---------------------------------------------------


def layer_sizes() -> np.ndarray:
    params = MODEL.init(jax.random.key(0))
    return np.array([sum(x.size for x in jax.tree.leaves(layer)) for layer in params.values()])


def priced_seconds() -> np.ndarray:
    """``[N, D]`` expected seconds of each client at each depth (no overhead), in float64."""
    sizes = layer_sizes()
    up_bytes = 4.0 * np.cumsum(sizes[::-1])[::-1]  # float32 bytes of the layers from depth d on
    costs = freeze_pricing.step_costs(
        SPEC, TIMELYFL.hyper(), device_split(DATA.train), depth_masks(MODEL.init(jax.random.key(0)))
    ).astype(np.float64)
    return up_bytes[0] / BANDWIDTH + FULL_COMPUTE[:, None] * costs[None, :] + up_bytes / BANDWIDTH


def expected_depths(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per client, the least depth that fits ``INTERVAL`` (the deepest if none) and whether one fits."""
    fits = seconds <= INTERVAL
    return np.where(fits.any(1), fits.argmax(1), seconds.shape[1] - 1), fits.any(1)


def reference_sgd(params: list, x, y, indices, mask, steps: int, depth: int) -> list:
    """float64 SGD on the masked mean cross-entropy of the ReLU MLP; layers before ``depth`` held."""
    params = [(w.copy(), b.copy()) for w, b in params]
    for s in range(steps):
        xb, yb, m = x[indices[s]], y[indices[s]], mask[s].astype(np.float64)
        acts, pre = [xb], []
        for i, (w, b) in enumerate(params):
            pre.append(acts[-1] @ w + b)
            acts.append(pre[-1] if i == len(params) - 1 else np.maximum(pre[-1], 0.0))
        logits = acts[-1]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        g = (p - np.eye(C)[yb]) * (m / max(m.sum(), 1.0))[:, None]
        grads = []
        for i in reversed(range(len(params))):
            grads.append((acts[i].T @ g, g.sum(axis=0)))
            g = (g @ params[i][0].T) * (pre[i - 1] > 0) if i > 0 else None
        grads.reverse()
        params = [
            (w - CLIENT_LR * gw, b - CLIENT_LR * gb) if i >= depth else (w, b)
            for i, ((w, b), (gw, gb)) in enumerate(zip(params, grads))
        ]
    return params


def as_layers(params) -> list:
    return [
        (np.asarray(layer["kernel"], np.float64), np.asarray(layer["bias"], np.float64))
        for layer in params.values()
    ]


# ---- tests --------------------------------------------------------------------------------


def test_the_least_frozen_depth_that_fits_the_interval():
    pick = lambda seconds, interval: int(least_frozen_fitting(jnp.array(seconds), interval))
    assert pick([3.0, 2.0, 1.0], 5.0) == 0  # all fit: train everything
    assert pick([9.0, 7.0, 6.5], 5.0) == 2  # none fits: the deepest freeze
    assert pick([9.0, 5.0, 1.0], 5.0) == 1  # the first that fits, boundary included
    assert pick([9.0, 4.0, 6.0, 1.0], 5.0) == 1  # not assumed monotone
    assert pick([jnp.nan, 6.0, 4.0], 5.0) == 2  # an unknown time does not fit
    assert pick([8.0], 5.0) == 0  # one depth only
    # Through Freezing.choose, with the interval traced: one program over three intervals.
    seconds = jnp.array([9.0, 5.0, 2.0])
    choose = jax.jit(jax.vmap(lambda t: choose_depth(None, seconds, jnp.nan, {"interval": t})))
    np.testing.assert_array_equal(choose(jnp.array([1.0, 6.0, 100.0])), [2, 1, 0])
    rule = TIMELYFL.hook(Freezing)
    assert rule.probe_share == 0.0 and rule.choose is choose_depth
    assert TIMELYFL.name == "timelyfl" and float(TIMELYFL.hyper()["interval"]) == INTERVAL


def test_slow_clients_freeze_deeper_and_every_counted_client_finishes_in_the_interval():
    seconds = priced_seconds()
    depths, fits = expected_depths(seconds)
    assert set(depths[fits]) == {0, 1, 2} and not fits.all()  # the setting reaches every case
    history = run(TIMELYFL, cohort=6, rounds=3)
    s = jax.tree.map(np.asarray, history.schedule)
    valid, ids = s.valid, s.selected
    ok = valid & (s.outcome == OK)
    # Counted: exactly the clients that fit at some depth; the others miss the deadline.
    np.testing.assert_array_equal(ok, valid & fits[ids])
    assert np.all(s.outcome[valid & ~fits[ids]] == LATE)
    # The depth each counted client used, read from what it uploaded.
    up_bytes = {int(b): d for d, b in enumerate(4 * np.cumsum(layer_sizes()[::-1])[::-1])}
    used = np.array([up_bytes[int(b)] for b in s.bytes_up[ok]])
    np.testing.assert_array_equal(used, depths[ids[ok]])
    assert set(used) == {0, 1, 2}
    order = np.argsort(FULL_COMPUTE[ids[ok]])
    assert np.all(np.diff(used[order]) >= 0)  # slower clients freeze at least as deep
    # Every counted client finishes inside the interval, at its priced time.
    took = s.finish[ok] - OVERHEAD
    assert np.all(took <= INTERVAL * (1 + 1e-6))
    np.testing.assert_allclose(took, seconds[ids[ok], used], rtol=1e-5)
    # FedAvg under the same deadline counts only the clients that fit with every layer.
    plain = fedavg(
        client_optimizer=optimizers.sgd("client", lr=CLIENT_LR), aggregator=masked_mean()
    )
    plain_ok = np.asarray(run(plain, cohort=6, rounds=3).schedule.outcome) == OK
    assert plain_ok.sum() < ok.sum()


def test_one_round_matches_the_float64_reference():
    history = run(TIMELYFL, cohort=N, rounds=1, chunk=3)
    row = jax.tree.map(lambda a: np.asarray(a)[0], history.schedule)
    ids = row.selected
    depths, fits = expected_depths(priced_seconds())
    np.testing.assert_array_equal(row.outcome == OK, fits[ids])
    key = rng.seed_key(0)
    start = as_layers(MODEL.init(rng.stream(key, "init")))
    tasks = local.ClientTask(
        ids, jnp.ones(N), jnp.full(N, local.NO_STEP_LIMIT, jnp.int32),
        rng.client_keys(key, jnp.int32(0), "train", jnp.asarray(ids)),
    )  # fmt: skip
    train = device_split(DATA.train)
    indices, _, engine_steps = jax.device_get(
        jax.vmap(lambda task: local.client_batches(SPEC, task, train))(tasks)
    )
    x, y = DATA.train.x.astype(np.float64), DATA.train.y
    sums = [(np.zeros_like(w), np.zeros_like(b)) for w, b in start]
    weights = np.zeros(len(start))
    for slot, k in enumerate(ids):
        if not fits[k]:
            continue
        count = int(DATA.train.count[k])
        examples = math.ceil(WORK.epochs * count)
        steps = math.ceil(examples / WORK.batch_size)
        assert engine_steps[slot] == steps
        lo = int(DATA.train.offset[k])
        assert np.all((indices[slot] >= lo) & (indices[slot] < lo + count)), f"{k}: foreign rows"
        mask = np.arange(indices.shape[1] * WORK.batch_size).reshape(indices.shape[1:]) < examples
        trained = reference_sgd(start, x, y, indices[slot], mask, steps, int(depths[k]))
        for i in range(int(depths[k]), len(start)):
            (w0, b0), (w, b) = start[i], trained[i]
            sums[i] = (sums[i][0] + count * (w0 - w), sums[i][1] + count * (b0 - b))
            weights[i] += count
    assert np.all(weights > 0) and weights[0] < weights[-1]  # every layer trained, not by all
    want = [(w0 - sw / n, b0 - sb / n) for (w0, b0), (sw, sb), n in zip(start, sums, weights)]
    for (w, b), (got_w, got_b) in zip(want, as_layers(history.params)):
        np.testing.assert_allclose(got_w, w, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got_b, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: timelyfl(interval=0.0), "timelyfl: interval must lie in (0, inf), got 0.0"),
        (lambda: timelyfl(interval=-3.0), "timelyfl: interval must lie in (0, inf), got -3.0"),
        (lambda: timelyfl(interval=math.inf), "timelyfl: interval must be a finite number"),
        (lambda: timelyfl(interval=math.nan), "timelyfl: interval must be a finite number"),
        (lambda: timelyfl(client_lr=0.0), "timelyfl: client_lr must lie in (0, inf), got 0.0"),
        (lambda: timelyfl().hyper({"interval": -1.0}), "interval must lie in (0, inf), got -1.0"),
        (lambda: timelyfl().hyper({"deadline": 3.0}), "timelyfl has no hyperparameter 'deadline'"),
    ],
)
def test_bad_hyperparameters_are_one_line_errors(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert message in str(err.value) and "\n" not in str(err.value)
