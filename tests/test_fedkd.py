"""FedKD against a float64 per-client sequential reference written here.

The reference trains two multinomial logistic regressions per client with numpy SGD, the
mentee from the global model and the mentor from the client's stored one, on the same
batches, each on its own loss (Wu et al. 2022, Eqs. 5-6): the masked mean cross-entropy plus
the batch's mean KL towards the other model's prediction, divided by the sum of both
cross-entropies. In closed form, per example and over logits, the mentee's gradient is
``(p_s - onehot) + (p_s - p_t) / (CE_s + CE_t)`` and the mentor's is the same with s and t
swapped. The upload is the mentee's delta with every matrix cut to its top ``r`` singular
values by numpy's SVD (Eq. 7); the server steps by ``server_lr`` along the weighted mean.
Rounds, batches and tolerances are ``test_qffl_ditto``'s (ragged clients, step limits, a
weight-0 client, two rounds so that the stored mentors matter).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_qffl_ditto import (
    CLIENT_LR,
    ROUNDS,
    SERVER_LR,
    SIZES,
    C,
    as64,
    client_rows,
    device_split,
    engine_batches,
    make_round,
    make_store,
    make_tasks,
    pack,
    start,
    train_cohort,
    tree_close,
    unpack,
)

from fedjax_het import rng
from fedjax_het.algorithms.fedkd import fedkd
from fedjax_het.engine.hooks import PayloadBytes


def softmax(logits):
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def reference_fedkd(mentee, mentor, data, lr):
    """float64 mutual distillation: returns the trained pair and the mentee's loss sum."""
    x, y, indices, mask, steps = data
    (ws, bs), (wt, bt) = unpack(mentee), unpack(mentor)
    loss_sum = 0.0
    for s in range(steps):
        xb, yb, m = x[indices[s]], y[indices[s]], mask[s].astype(np.float64)
        onehot, norm = np.eye(C)[yb], m / max(m.sum(), 1.0)
        ps, pt = softmax(xb @ ws + bs), softmax(xb @ wt + bt)
        ce_s = -np.log(ps[np.arange(len(yb)), yb]) @ norm
        ce_t = -np.log(pt[np.arange(len(yb)), yb]) @ norm
        loss_sum += ce_s * max(m.sum(), 1.0) if m.sum() else 0.0
        scale = 1.0 / (ce_s + ce_t) if ce_s + ce_t > 0 else 0.0
        gs = ((ps - onehot) + scale * (ps - pt)) * norm[:, None]
        gt = ((pt - onehot) + scale * (pt - ps)) * norm[:, None]
        ws, bs = ws - lr * xb.T @ gs, bs - lr * gs.sum(axis=0)
        wt, bt = wt - lr * xb.T @ gt, bt - lr * gt.sum(axis=0)
    return pack(ws, bs), pack(wt, bt), loss_sum


def truncate(delta, rank_share):
    """numpy's rank-r approximation of each matrix of ``delta``; vectors as they are."""
    w, b = unpack(delta)
    r = max(1, math.ceil(rank_share * min(w.shape)))
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    return pack((u[:, :r] * s[:r]) @ vt[:r], b)


@pytest.mark.parametrize("rank_share", [0.5, 1.0])
def test_fedkd_matches_sequential_reference(rank_share):
    """Two rounds of FedKD: global mentee, every stored mentor, the reported training loss.

    Round one starts every mentor at the global model, so the KL terms vanish; in round two
    client 2's mentor is the one it trained and client 3's the initial model, so both
    distillation directions act. At rank_share 0.5 the 5 x 3 kernel's update keeps 2 of its
    3 singular values; at 1 it is sent whole. Clients that did not count keep their mentor
    bitwise. rtol 1e-5, atol 1e-6.
    """
    algorithm = fedkd(rank_share=rank_share, client_lr=CLIENT_LR, server_lr=SERVER_LR)
    store, key = make_store(), rng.seed_key(8)
    hyper = algorithm.hyper()
    round_ = make_round(algorithm)
    train = device_split(store)
    state = start(algorithm, hyper, key)
    global_ = as64(state.server_state.params)
    mentors = [global_] * len(SIZES)
    for r, (ids, limits, weights) in enumerate(ROUNDS):
        tasks = make_tasks(r, ids, limits, weights, key)
        all_indices, all_steps = jax.device_get(engine_batches(round_.spec, tasks, train))
        old_states = jax.device_get(state.client_states)
        state, _, metrics = train_cohort(
            round_, state, jnp.asarray(ids, jnp.int32), tasks, hyper, train
        )
        total, new_mentors, loss_sum, examples = jax.tree.map(np.zeros_like, global_), [], 0.0, 0
        new_mentors = list(mentors)
        for slot, k in enumerate(ids):
            data = client_rows(
                store, round_.spec, k, all_indices[slot], all_steps[slot], limits[slot]
            )
            mentee, mentor, client_loss = reference_fedkd(global_, mentors[k], data, CLIENT_LR)
            loss_sum, examples = loss_sum + client_loss, examples + int(data[3][: data[4]].sum())
            if weights[slot] > 0:
                delta = truncate(jax.tree.map(np.subtract, global_, mentee), rank_share)
                total = jax.tree.map(lambda t, d, w=weights[slot]: t + w * d, total, delta)
                new_mentors[k] = mentor
        norm = sum(w for w in weights if w > 0)
        global_ = jax.tree.map(lambda g, t, n=norm: g - SERVER_LR * t / n, global_, total)
        mentors = new_mentors
        tree_close(algorithm.global_params(state.server_state), global_)
        np.testing.assert_allclose(metrics["train_loss"], loss_sum / examples, rtol=1e-5)
        states = jax.device_get(state.client_states)
        counted = {k for k, w in zip(ids, weights) if w > 0}
        for k in range(len(SIZES)):
            mine = jax.tree.map(lambda s, k=k: s[k], states)
            if k not in counted:
                jax.tree.map(lambda a, b, k=k: np.testing.assert_array_equal(a, b[k]), mine,
                             old_states)
            tree_close(mine, mentors[k])


def test_fedkd_upload_bytes_follow_the_rank():
    """A 784 x 200 kernel at rank_share 0.1 keeps r = 20: 20 (784 + 200 + 1) floats up."""
    params = {"kernel": jnp.zeros((784, 200)), "bias": jnp.zeros(200)}
    down, up = fedkd(rank_share=0.1).hook(PayloadBytes).count(params)
    assert down == 4 * (784 * 200 + 200)
    assert up == 4 * (20 * (784 + 200 + 1) + 200)


def test_fedkd_refuses_a_rank_share_outside_the_unit_interval():
    with pytest.raises(ValueError, match="rank_share"):
        fedkd(rank_share=0.0)
