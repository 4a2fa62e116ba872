"""A float64 per-client sequential reference for rounds that first read a statistic of the
cohort (a ``CohortProbe``: Mime's control variate, Agnostic FedAvg's domain losses) or a
client's id, and the toy model FedJAX's tests use.

``check_rounds`` runs ``tests/test_scaffold_feddyn.py``'s rounds (ragged clients of 1 to 30
examples, step limits, a counted client without work, a weight-0 client that trains, a round
in which nobody counts; chunk 2 over cohorts of 3) through the engine and through a
``Reference`` written in numpy, side by side, and compares after every round the global
model, the server fields the reference names, the round's training loss and every client's
state (bitwise unchanged for clients that did not count). Only the row indices of each
client's batches come from the engine; the reference rebuilds step counts and masks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import test_scaffold_feddyn as base

from fedjax_het import rng
from fedjax_het.data.federated import ClientArrays
from fedjax_het.engine import local
from fedjax_het.engine.round import server_stream
from fedjax_het.models import Model

N, C, ROUNDS = base.N, base.C, base.ROUNDS
Tree = dict


def cross_entropy(params: Tree, xb: np.ndarray, yb: np.ndarray, m: np.ndarray):
    """Logistic regression's masked mean cross-entropy at ``params`` in float64:
    ``(gradient, Σ_j m_j ℓ_j)``."""
    w, b = params["Dense_0"]["kernel"], params["Dense_0"]["bias"]
    logits = xb @ w + b
    top = logits.max(axis=1, keepdims=True)
    p = np.exp(logits - top)
    losses = top[:, 0] + np.log(p.sum(axis=1)) - logits[np.arange(len(yb)), yb]
    p /= p.sum(axis=1, keepdims=True)
    g = (p - np.eye(C)[yb]) * (m / max(m.sum(), 1.0))[:, None]
    return base.pack(xb.T @ g, g.sum(axis=0)), float(losses @ m)


def batches(data):
    """A client's ``(x, y, mask)`` batches of the round, step by step (``base.client_rows``)."""
    x, y, indices, mask, steps = data
    for s in range(steps):
        yield x[indices[s]], y[indices[s]], mask[s].astype(np.float64)


def every_example(store: ClientArrays, k: int):
    """Client ``k``'s rows once, as one float64 batch ``(x, y, mask)``."""
    rows = slice(int(store.offset[k]), int(store.offset[k] + store.count[k]))
    return store.x[rows].astype(np.float64), store.y[rows], np.ones(int(store.count[k]))


def axpy(a: float, x: Tree, y: Tree) -> Tree:
    """``a x + y``, leaf by leaf."""
    return jax.tree.map(lambda u, v: a * u + v, x, y)


def weighted_mean(pairs) -> Tree | None:
    """``Σ w t / Σ w`` over ``(t, w)`` with ``w > 0``; None when there are none."""
    pairs = [(t, w) for t, w in pairs if w > 0]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    out = jax.tree.map(lambda t: pairs[0][1] * t, pairs[0][0])
    for t, w in pairs[1:]:
        out = axpy(w, t, out)
    return jax.tree.map(lambda t: t / total, out)


@dataclasses.dataclass(frozen=True)
class Reference:
    """One algorithm in numpy.

    Attributes:
      extras: ``x -> {name: value}`` the server's fields besides ``x``, compared with the
        engine's server-state fields of the same names after every round.
      client_state: ``x -> state`` every client's first state.
      before: ``(server, [(k, weight, every_example(k))] of the counted slots) -> server``,
        what the server gathers before training (default: nothing).
      client: ``(k, data, server, state) -> (trained, new state, loss sum)``.
      after: ``(server, [(k, trained, new state, weight)]) -> server``.
    """

    extras: Callable[[Tree], dict]
    client_state: Callable[[Tree], object]
    client: Callable
    after: Callable
    before: Callable = lambda server, cohort: server


def check_rounds(
    algorithm, hyper: dict, key, ref: Reference, *, precision: str = "float32",
    rtol: float = base.RTOL, atol: float = base.ATOL,
):  # fmt: skip
    """Runs ``ROUNDS`` through the engine and ``ref`` side by side, checking every round;
    returns the reference's last server and the engine's last state."""
    store = base.make_store()
    round_, train = base.make_round(algorithm, precision=precision), base.device_split(store)
    hyper = algorithm.hyper(hyper, dtype=local.hyper_dtype(precision))
    state = base.start(algorithm, round_.model, hyper, key)
    x = base.as64(algorithm.global_params(state.server_state))
    server = {"x": x, **ref.extras(x)}
    states = [ref.client_state(x) for _ in range(N)]
    close = functools.partial(base.tree_close, rtol=rtol, atol=atol)
    for r, (ids, limits, weights) in enumerate(ROUNDS):
        tasks = base.make_tasks(r, ids, limits, weights, key)
        all_indices, all_steps = jax.device_get(base.engine_batches(round_.spec, tasks, train))
        old_states = jax.device_get(state.client_states)
        state, _, metrics = base.train_cohort(
            round_, state, jnp.asarray(ids, jnp.int32), tasks, hyper, train,
            server_stream(key, jnp.int32(r)),
        )  # fmt: skip
        counted = [(k, w, every_example(store, k)) for k, w in zip(ids, weights) if w > 0]
        server = ref.before(server, counted)
        clients, loss_sum, examples = [], 0.0, 0
        for slot, k in enumerate(ids):
            data = base.client_rows(
                store, round_.spec, k, all_indices[slot], all_steps[slot], limits[slot]
            )
            trained, new, client_loss = ref.client(k, data, server, states[k])
            clients.append((k, trained, new, weights[slot]))
            loss_sum, examples = loss_sum + client_loss, examples + int(data[3][: data[4]].sum())
        server = ref.after(server, clients)
        for k, _, new, weight in clients:
            if weight > 0:
                states[k] = new
        close(algorithm.global_params(state.server_state), server["x"])
        for name in ref.extras(x):
            close(getattr(state.server_state, name), server[name])
        np.testing.assert_allclose(metrics["train_loss"], loss_sum / examples, rtol=rtol, atol=atol)
        engine_states = jax.device_get(state.client_states)
        counted_ids = {k for k, _, _ in counted}
        for k in range(N):
            mine = jax.tree.map(lambda s, k=k: s[k], engine_states)
            if k not in counted_ids:
                jax.tree.map(
                    lambda a, b, k=k: np.testing.assert_array_equal(a, b[k]), mine, old_states
                )
            close(mine, states[k])
    return server, state


def linear_toy(w: float) -> Model:
    """FedJAX's toy model of its algorithm tests: parameter ``w``, per-example loss ``x w``."""
    return Model(
        init=lambda key: {"w": jnp.float32(w)},
        apply=lambda params, x, *, train, key: x[:, 0] * params["w"],
        per_example_loss=lambda outputs, y: outputs,
        name="linear_toy",
    )


def toy_store(*clients: list[float]) -> ClientArrays:
    """Clients whose examples are the given numbers (feature shape ``[1]``, labels 0)."""
    xs = [np.asarray(c, np.float32)[:, None] for c in clients]
    return ClientArrays.from_clients(xs, [np.zeros(len(c), np.int32) for c in clients])


def check_traced(algorithm, name: str, values: tuple[float, float]) -> None:
    """Two jitted rounds at each of two values of hyperparameter ``name``: one compilation, and
    the run states (server and client states) differ."""
    key, train = rng.seed_key(9), base.device_split(base.make_store())
    ids, limits, weights = ROUNDS[2]
    tasks = base.make_tasks(0, ids, limits, weights, key)
    round_ = base.make_round(algorithm)
    results, sizes = [], []
    for value in values:
        hyper = algorithm.hyper({name: value})
        state = base.start(algorithm, base.LOGREG, hyper, key)
        for _ in range(2):  # a second round: what the first moved is read
            state, _, _ = base.train_cohort(
                round_, state, jnp.asarray(ids, jnp.int32), tasks, hyper, train
            )
        results.append(np.concatenate([np.ravel(a) for a in jax.tree.leaves(state)]))
        sizes.append(base.train_cohort._cache_size())
    assert sizes[1] == sizes[0]
    assert not np.allclose(*results)
