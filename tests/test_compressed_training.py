"""Compressed updates in training: the server aggregates what it decodes, the clock carries the bytes.

``compression.compressed`` wraps an algorithm: clients send an encoding of
their update (its state, error feedback's residual, is client state) and
receive the model cast to a narrower float. Checked here:
- top-k with error feedback on FedAvg against a float64 per-client
  sequential reference (``test_scaffold_feddyn.run_rounds``: ragged clients,
  step limits, a weight-0 client that trains, a round nobody counts), with
  numpy top-k and residuals: rtol 1e-5, atol 1e-6;
- no compression at all is plain FedAvg, bit for bit;
- a randomised encoding (QSGD) gives the same run for every vmapped chunk size;
- the schedule carries the encoded bytes, so under a deadline compression
  lets clients finish that full updates would not;
- what cannot be compressed is refused in one line.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scaffold_feddyn as reference

from fedjax_het import models
from fedjax_het.algorithms import fedavg, scaffold
from fedjax_het.algorithms.freezefl import freezefl
from fedjax_het.data import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.engine.algorithm import ClientStats
from fedjax_het.engine.hooks import PayloadBytes
from fedjax_het.front.config import ConfigError, build, load
from fedjax_het.sampling import uniform
from fedjax_het.system import setup
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options
from fedjax_het.transforms import compression
from fedjax_het.transforms.compression import (
    ErrorFeedbackState,
    compressed,
    error_feedback,
    qsgd,
    top_k,
)

FRACTION = 0.4  # of the reference's logistic regression: 6 of 15 weights, 2 of 3 biases
NUM_CLIENTS = 6
DATA = leaf_synthetic(num_clients=NUM_CLIENTS, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
MODEL = models.mlp(DATA.example_shape, DATA.num_classes, hidden=(8,))
COMMON = {"rounds": 4, "eval_every": 2, "work": LocalWork(batch_size=5, epochs=1.5),
          "hyper": {"client_lr": 0.1}, "progress": False, "devices": 1}  # fmt: skip


def numpy_top_k(p: np.ndarray) -> np.ndarray:
    """``p`` with all but its ``ceil(FRACTION d)`` largest magnitudes zeroed (ties: lowest index)."""
    flat = p.reshape(-1)
    k = math.ceil(FRACTION * flat.size)
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    sent = np.zeros_like(flat)
    sent[keep] = flat[keep]
    return sent.reshape(p.shape)


def residual_state(x):
    """The engine's client state of the wrapped FedAvg: (FedAvg's none, the residual)."""
    return (), ErrorFeedbackState(reference.zeros_like(x), ())


def top_k_client(data, server, state):
    """Plain SGD from x; sends top_k(x - y + e) and keeps the rest as the residual."""
    x = server["x"]
    trained, loss_sum = reference.reference_sgd(
        x, data, reference.CLIENT_LR, lambda p: reference.zeros_like(p)
    )
    corrected = jax.tree.map(lambda a, b, e: a - b + e, x, trained, state[1].residual)
    sent = jax.tree.map(numpy_top_k, corrected)
    residual = jax.tree.map(np.subtract, corrected, sent)
    seen = jax.tree.map(np.subtract, x, sent)  # the model the server's mean treats as trained
    return seen, ((), ErrorFeedbackState(residual, ())), loss_sum


def server_sgd(server, clients):
    step = reference.weighted_step(server["x"], clients)
    return {"x": jax.tree.map(lambda a, d: a - reference.SERVER_LR * d, server["x"], step)}


def test_top_k_with_error_feedback_matches_sequential_reference():
    algorithm = compressed(fedavg(), upload=error_feedback(top_k(FRACTION)))
    hyper = {"client_lr": reference.CLIENT_LR, "server_lr": reference.SERVER_LR}
    reference.run_rounds(
        algorithm, hyper, reference.rng.seed_key(4), top_k_client, server_sgd, lambda x: {},
        client_state=residual_state,
    )  # fmt: skip


def test_no_compression_is_plain_fedavg_bit_for_bit():
    plain = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=fedavg(),
            sampler=uniform(NUM_CLIENTS, 3),
            **COMMON,
        ),
    )
    wrapped = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=compressed(fedavg()),
            sampler=uniform(NUM_CLIENTS, 3),
            **COMMON,
        ),
    )
    jax.tree.map(np.testing.assert_array_equal, plain.params, wrapped.params)
    np.testing.assert_array_equal(plain.round_metrics["train_loss"],
                                  wrapped.round_metrics["train_loss"])  # fmt: skip


def test_randomised_encoding_does_not_depend_on_the_chunk():
    algorithm = compressed(fedavg(), upload=qsgd(4))
    runs = [
        simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=algorithm,
                sampler=uniform(NUM_CLIENTS, 5),
                chunk=chunk,
                **COMMON,
            ),
        )
        for chunk in (2, 3)
    ]
    jax.tree.map(np.testing.assert_array_equal, runs[0].params, runs[1].params)
    plain = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=fedavg(),
            sampler=uniform(NUM_CLIENTS, 5),
            chunk=2,
            **COMMON,
        ),
    )
    gaps = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), runs[0].params, plain.params)
    assert max(jax.tree.leaves(gaps)) > 1e-4  # the quantisation did something


def test_the_schedule_carries_the_encoded_bytes():
    """At 500 B/s and a 1 s deadline a full MLP update (332 B each way) is late; 5% of it,
    with the model downloaded in float16, is not."""
    profiles = setup.profiles_from_options(
        NUM_CLIENTS, devices="lognormal", step_time=0.01, bandwidth=500.0, dropout=0.0
    )
    sys = setup.System(profiles, setup.policy_from_options(kind="deadline", deadline=1.0))
    small = compressed(fedavg(), upload=top_k(0.05), download="float16")
    shapes = jax.eval_shape(MODEL.init, jax.random.key(0))
    full = 4 * sum(leaf.size for leaf in jax.tree.leaves(shapes))
    assert small.hook(PayloadBytes).count(shapes) == (full // 2, compression.bytes_sent(top_k(0.05), shapes))
    runs = {
        name: simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=algorithm,
                sampler=uniform(NUM_CLIENTS, 3),
                system=sys,
                **COMMON,
            ),
        )
        for name, algorithm in (("full", fedavg()), ("small", small))
    }
    assert np.sum(runs["small"].round_metrics["late"]) < np.sum(runs["full"].round_metrics["late"])
    up = runs["small"].round_metrics["bytes_up"] / np.maximum(runs["small"].round_metrics["ok"], 1)
    assert np.all(up[runs["small"].round_metrics["ok"] > 0] < full / 5)


def test_majority_vote_is_the_sign_of_the_counted_signs():
    """Three counted clients vote per coordinate; a weight-0 client's NaNs do not; a tie is 0."""
    updates = np.array([[0.5, -2.0, 0.1, 3.0], [-0.1, -1.0, -4.0, 2.0],
                        [0.2, 5.0, 0.0, -1.0], [np.nan, np.nan, 9.0, -9.0]], np.float32)
    weights = np.array([1.0, 30.0, 2.0, 0.0], np.float32)
    rule = compression.majority_vote()
    stats = ClientStats(jnp.zeros(4), jnp.zeros(4), jnp.zeros(4, jnp.int32))
    votes = jax.vmap(rule.contribute)({"w": jnp.asarray(updates)}, jnp.asarray(weights), stats)
    got = rule.finalize(jax.tree.map(lambda v: v.sum(0), votes))["w"]
    signs = np.where(updates[:3] >= 0, 1.0, -1.0)  # what sign() sends (sign(0) = +1)
    np.testing.assert_array_equal(got, np.sign(np.sign(updates[:3]).sum(0)))
    np.testing.assert_array_equal(rule.finalize({"w": jnp.asarray(signs.sum(0))})["w"],
                                  [1.0, -1.0, 1.0, 1.0])  # fmt: skip
    tie = rule.finalize({"w": jnp.zeros(2)})["w"]
    np.testing.assert_array_equal(tie, [0.0, 0.0])


def test_signsgd_with_majority_vote_trains_on_one_bit_a_value():
    algorithm = compressed(fedavg(), upload=compression.sign(), majority_vote=True)
    shapes = jax.eval_shape(MODEL.init, jax.random.key(0))
    values = sum(leaf.size for leaf in jax.tree.leaves(shapes))
    assert algorithm.hook(PayloadBytes).count(shapes)[1] == math.ceil(values / 8)
    history = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=algorithm,
            sampler=uniform(NUM_CLIENTS, 3),
            **{**COMMON, "rounds": 8, "hyper": {"client_lr": 0.1, "server_lr": 0.003}},
        ),
    )
    assert history.metrics[-1]["test_loss"] < history.metrics[0]["test_loss"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: compressed(freezefl(), upload=top_k(0.1)),
        lambda: compressed(fedavg(), download="float64"),
        lambda: compression.from_options(upload="gzip"),
        lambda: compression.from_options(levels=0),
        lambda: compression.from_options(fraction=1.5),
        lambda: compression.from_options(upload="top_k", majority_vote=True),
    ],
)
def test_impossible_compression_is_a_one_line_error(make):
    with pytest.raises(ValueError) as err:
        make()
    assert "\n" not in str(err.value)


def test_an_update_that_is_not_a_model_delta_is_refused():
    with pytest.raises(ValueError, match="more than a model delta"):
        simulate.run(
            DATA,
            *run_options(
                model=MODEL,
                algorithm=compressed(scaffold(), upload=top_k(0.1)),
                sampler=uniform(NUM_CLIENTS, 3),
                **COMMON,
            ),
        )  # fmt: skip


def test_compression_table_in_the_config():
    experiment = build(load(None, ["compression.upload='qsgd'", "compression.levels=8"]))
    assert experiment.config["compression"]["upload"] == "qsgd"
    assert experiment.algorithm.hook(PayloadBytes) is not None
    with pytest.raises(ConfigError, match="compression.fraktion"):
        build(load(None, ["compression.fraktion=0.1"]))
    with pytest.raises(ConfigError, match=r"\[compression\] top_k: fraction"):
        build(load(None, ["compression.upload='top_k'", "compression.fraction=0.0"]))
