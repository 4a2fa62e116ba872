"""FedProx, FedNova and masked aggregation against closed forms; a contract over the registry."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, registry
from fedjax_het.algorithms import fedavg, fednova, fedprox
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import ClientStats, masked_mean, weighted_mean
from fedjax_het.engine.cohort import run_cohort
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.system.sampler import Sampler

NUM_FEATURES, NUM_CLASSES = 4, 3
SIZES = (5, 12, 30)
MODEL = models.logistic_regression((NUM_FEATURES,), NUM_CLASSES)
TWO_LAYERS = models.mlp((NUM_FEATURES,), NUM_CLASSES, hidden=(8,))


def store() -> ClientArrays:
    gen = np.random.default_rng(1)
    xs = [gen.normal(k, 1.0, (n, NUM_FEATURES)).astype(np.float32) for k, n in enumerate(SIZES)]
    ys = [gen.integers(0, NUM_CLASSES, n).astype(np.int32) for n in SIZES]
    return ClientArrays.from_clients(xs, ys)


def one_round(algorithm, *, step_limit=None, with_clients=False):
    """Global params before and after one round over every client, and (if asked) each
    client's own ``local_update`` result, run one at a time."""
    work = LocalWork(batch_size=4, epochs=2)
    data = store()
    ids = jnp.arange(len(SIZES), dtype=jnp.int32)
    sampler = Sampler(select=lambda key, r: ids, num_clients=len(SIZES), cohort_size=len(SIZES))
    max_count = int(data.count.max())
    spec = local.LocalSpec(MODEL, algorithm, work, work.static_steps(max_count), max_count)
    round_ = Round(MODEL, algorithm, sampler, spec, chunk=2)
    hyper = algorithm.hyper()
    key = jax.random.key(3)
    split = device_split(data)
    state = init_state(MODEL, algorithm, len(SIZES), hyper, key)
    _, tasks = round_.cohort(jnp.int32(0), split, key)
    if step_limit is not None:
        tasks = tasks.replace(step_limit=jnp.asarray(step_limit, jnp.int32))
    broadcast = algorithm.broadcast(state.server_state)
    update_one = jax.jit(local.local_update, static_argnums=0)
    clients = [
        update_one(spec, hyper, broadcast, (), jax.tree.map(lambda t: t[k], tasks), split)
        for k in range(len(SIZES) if with_clients else 0)
    ]
    new_state, _ = _step(round_, state, tasks, hyper, split)
    return broadcast, algorithm.global_params(new_state.server_state), clients, tasks


@functools.partial(jax.jit, static_argnums=0)
def _step(round_, state, tasks, hyper, split):
    """One round over given tasks (the engine's round without selection)."""
    algorithm = round_.algorithm
    broadcast = algorithm.broadcast(state.server_state)
    client_fn = functools.partial(local.local_update, round_.spec, hyper, broadcast, data=split)
    sums, _, stats = run_cohort(client_fn, jax.tree.map(lambda s: s[tasks.client_id], state.client_states),
                                tasks, algorithm.aggregator, chunk=round_.chunk)
    server_state = algorithm.server_update(state.server_state, algorithm.aggregator.finalize(sums), hyper)
    return state.replace(server_state=server_state), stats


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def test_fedprox_with_mu_zero_is_fedavg_bitwise():
    _, avg, _, _ = one_round(fedavg())
    _, prox, _, _ = one_round(fedprox(mu=0.0))
    np.testing.assert_array_equal(flat(avg), flat(prox))


def test_fedprox_local_steps_follow_the_proximal_gradient():
    """Each local step is w - lr * (grad F(w) + mu (w - w_t)), computed here with jax.grad of F alone."""
    mu, lr = 0.5, 0.1
    algorithm = fedprox(mu=mu, client_lr=lr)
    broadcast, _, clients, tasks = one_round(algorithm, with_clients=True)
    data = device_split(store())
    spec_work = LocalWork(batch_size=4, epochs=2)
    max_count = int(max(SIZES))
    spec = local.LocalSpec(MODEL, algorithm, spec_work, spec_work.static_steps(max_count), max_count)
    for k, (update, _, stats) in enumerate(clients):
        task = jax.tree.map(lambda t: t[k], tasks)
        indices, mask, steps = local.client_batches(spec, task, data)
        w = broadcast
        train_key = jax.random.fold_in(task.key, 0)  # logistic regression ignores the key
        for s in range(int(steps)):
            batch = (data.x[indices[s]], data.y[indices[s]], mask[s])
            grad = jax.grad(lambda p: MODEL.loss(MODEL.apply(p, batch[0], train=True, key=train_key), batch[1], batch[2]))(w)
            w = jax.tree.map(lambda p, g, b: p - lr * (g + mu * (p - b)), w, grad, broadcast)
        expected = jax.tree.map(lambda b, p: b - p, broadcast, w)
        np.testing.assert_allclose(flat(update), flat(expected), rtol=1e-5, atol=1e-6)


def test_fednova_is_the_normalised_average():
    """tau_eff * sum p_k Delta_k / tau_k (Wang et al. 2020, Eq. 6-7), from each client's own result."""
    limits = [1, 3, 100]  # very different local work per client
    broadcast, new, clients, tasks = one_round(fednova(), step_limit=limits, with_clients=True)
    p = np.asarray(tasks.weight, np.float64) / float(np.sum(tasks.weight))
    tau = np.array([int(stats.steps) for _, _, stats in clients], np.float64)
    assert tau.tolist() == [1, 3, 15]  # the third: 2 epochs of 30 examples in batches of 4
    deltas = np.stack([flat(update) for update, _, _ in clients])
    tau_eff = float(p @ tau)
    expected = flat(broadcast) - tau_eff * (p[:, None] * deltas / tau[:, None]).sum(0)
    np.testing.assert_allclose(flat(new), expected, rtol=1e-5, atol=1e-6)


def test_fednova_with_equal_steps_is_fedavg():
    _, avg, _, _ = one_round(fedavg(), step_limit=[2, 2, 2])
    _, nova, _, _ = one_round(fednova(), step_limit=[2, 2, 2])
    np.testing.assert_allclose(flat(avg), flat(nova), rtol=1e-6, atol=1e-7)


def test_masked_mean_averages_each_coordinate_over_its_trainers():
    updates = {"a": jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "b": jnp.array([1.0, 2.0, 100.0])}
    weights = jnp.array([1.0, 3.0, 2.0])
    trained = {"a": jnp.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), "b": jnp.array([1.0, 1.0, 0.0])}
    rule = masked_mean()
    stats = ClientStats(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3, jnp.int32), trained)
    sums = jax.tree.map(lambda c: c.sum(0), jax.vmap(rule.contribute)(updates, weights, stats))
    out = rule.finalize(sums)
    np.testing.assert_allclose(out["a"], [(1 * 1 + 3 * 3) / 4, 4.0])
    np.testing.assert_allclose(out["b"], (1 * 1 + 3 * 2) / 4)
    plain = weighted_mean()
    no_mask = ClientStats(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3, jnp.int32), None)
    sums = jax.tree.map(lambda c: c.sum(0), jax.vmap(plain.contribute)(updates, weights, no_mask))
    np.testing.assert_allclose(plain.finalize(sums)["b"], (1 + 6 + 200) / 6)


def test_weighted_mean_divides_exactly():
    """Every entry of the mean is the correctly rounded quotient (numpy's IEEE division), not
    a multiply by the rounded reciprocal (XLA's rewrite of a division by a broadcast scalar,
    1 ulp off in about a third of the entries)."""
    rule = weighted_mean()
    sums = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    for total in (np.float32(3.7), np.float32(37.0), np.float32(1e-3)):
        got = jax.jit(rule.finalize)(({"w": sums}, total))["w"]
        np.testing.assert_array_equal(got, sums / total)


def test_a_frozen_layer_is_bit_identical_after_a_round():
    """Every client freezes the bias: the global bias does not move, the kernel does."""
    algorithm = fedavg(aggregator=masked_mean())
    data = store()
    ids = jnp.arange(len(SIZES), dtype=jnp.int32)
    work = LocalWork(batch_size=4, epochs=1)
    spec = local.LocalSpec(MODEL, algorithm, work, work.static_steps(30), 30)
    hyper = algorithm.hyper()
    key = jax.random.key(0)
    split = device_split(data)
    state = init_state(MODEL, algorithm, len(SIZES), hyper, key)
    sampler = Sampler(select=lambda k, r: ids, num_clients=3, cohort_size=3)
    round_ = Round(MODEL, algorithm, sampler, spec, chunk=3)
    _, tasks = round_.cohort(jnp.int32(0), split, key)
    before = algorithm.global_params(state.server_state)
    mask = jax.tree.map(lambda p: jnp.ones((3,), p.dtype), before)
    mask["Dense_0"]["bias"] = jnp.zeros((3,), jnp.float32)
    new_state, _ = _step(round_, state, tasks.replace(train_mask=mask), hyper, split)
    after = algorithm.global_params(new_state.server_state)
    np.testing.assert_array_equal(after["Dense_0"]["bias"], before["Dense_0"]["bias"])
    assert not np.array_equal(after["Dense_0"]["kernel"], before["Dense_0"]["kernel"])


@pytest.mark.parametrize("name", registry.names("algorithm"))
def test_contract_every_registered_algorithm_learns_a_toy_problem(name):
    """Registered algorithms: hyperparameters are float32 scalars, the params keep their dtypes,
    and ten rounds on a small federated problem lower the training loss.

    The model has two layers (a body and a head) so that algorithms with personal layers
    (FedPer, FedRep) have something to share."""
    algorithm = registry.lookup("algorithm", name)()
    hyper = algorithm.hyper()
    assert all(v.dtype == jnp.float32 and v.shape == () for v in hyper.values())
    data = store()
    ids = jnp.arange(len(SIZES), dtype=jnp.int32)
    work = LocalWork(batch_size=4, epochs=1)
    spec = local.LocalSpec(TWO_LAYERS, algorithm, work, work.static_steps(30), 30)
    sampler = Sampler(select=lambda k, r: ids, num_clients=3, cohort_size=3)
    round_ = Round(TWO_LAYERS, algorithm, sampler, spec, chunk=3)
    key = jax.random.key(0)
    split = device_split(data)
    state = init_state(TWO_LAYERS, algorithm, 3, hyper, key)
    dtypes = jax.tree.map(lambda p: p.dtype, algorithm.global_params(state.server_state))
    step = jax.jit(lambda s, r: round_.step(s, r, hyper, split, key))
    losses = []
    for r in range(10):
        state, metrics = step(state, jnp.int32(r))
        losses.append(float(metrics["train_loss"]))
    assert step._cache_size() == 1
    assert jax.tree.map(lambda p: p.dtype, algorithm.global_params(state.server_state)) == dtypes
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
