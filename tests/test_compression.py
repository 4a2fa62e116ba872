"""Update compressors (``fedjax_het.transforms.compression``): decoded values, unbiasedness, exact bits.

- Deterministic compressors equal a numpy reference bit for bit. Their inputs
  are multiples of 1/16 in [-4, 4], so every sum (the scaled sign's
  ``||u||_1``) is exact in float32 whatever the summation order.
- Randomised compressors are unbiased: per coordinate, the mean of
  ``SAMPLES`` draws is within Hoeffding's bound of ``u``, with a Bonferroni
  correction over the coordinates. Each decoded coordinate lies in an interval
  of known width, so a correct compressor fails this with probability at most
  ``ALPHA`` (1e-6), with no normal approximation.
- Bit counts match hand counts for ``{"w": (3, 4), "b": (4,)}``.
"""

from __future__ import annotations

import doctest
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.transforms import compression
from fedjax_het.transforms.compression import (
    Payload,
    bits,
    bytes_sent,
    cast,
    chain,
    error_feedback,
    identity,
    qsgd,
    random_k,
    sign,
    terngrad,
    top_k,
)

SAMPLES = 20_000
ALPHA = 1e-6  # false-alarm rate of one statistical check, all its coordinates together
ROUNDING = 1e-6  # relative float32 rounding allowed on top of the statistical bound

SHAPES = {"w": (3, 4), "b": (4,)}
STRUCTS = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in SHAPES.items()}


def dyadic(seed: int, shapes=SHAPES) -> dict[str, np.ndarray]:
    """Multiples of 1/16 in [-4, 4], with ties and zeros: exact sums, and top-k ties to break."""
    rng = np.random.default_rng(seed)
    return {
        name: (rng.integers(-64, 65, size=shape) / 16).astype(np.float32)
        for name, shape in shapes.items()
    }


def gaussian(seed: int, shapes=SHAPES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def compress(compressor, update, key=0, *, jit=False):
    """One stateless call, as numpy."""
    apply = jax.jit(compressor.apply) if jit else compressor.apply
    sent, _ = apply(jax.tree.map(jnp.asarray, update), (), jax.random.key(key))
    return jax.tree.map(np.asarray, sent)


def eager_and_jit(compressor, update):
    return [compress(compressor, update, jit=jit) for jit in (False, True)]


# ---------------------------------------------------------------- numpy references


def np_cast(x: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond the range: inf, as intended
        return x.astype(dtype).astype(x.dtype)


def np_sign(x: np.ndarray, scaled: bool) -> np.ndarray:
    signs = np.where(x >= 0, 1, -1).astype(x.dtype)  # sign(0) = +1
    return np.abs(x).sum() * np.float32(1 / x.size) * signs if scaled else signs


def np_top_k(x: np.ndarray, fraction: float) -> np.ndarray:
    flat = x.reshape(-1)
    k = max(1, math.ceil(fraction * flat.size))
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]  # ties: the lower index first
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(x.shape)


@pytest.mark.parametrize(
    ("compressor", "reference"),
    [
        (cast("float16"), lambda x: np_cast(x, np.float16)),
        (cast("bfloat16"), lambda x: np_cast(x, jnp.bfloat16)),
        (cast("float32"), lambda x: x),
        (identity(), lambda x: x),
    ],
    ids=["float16", "bfloat16", "float32", "identity"],
)
def test_cast_rounds_like_numpy(compressor, reference):
    """Under jit too: XLA:GPU drops an astype(float16).astype(float32) pair (openxla/xla#41605)."""
    rng = np.random.default_rng(0)
    scale = 10.0 ** rng.integers(-12, 6, (40, 50))  # from float16's subnormals to its overflow
    update = {
        "w": (rng.normal(size=(40, 50)) * scale).astype(np.float32),
        "b": np.array([65519, 65520, -7e4, 3e-5, -2.98e-8, 2.99e-8, -0.0, 1e-40], np.float32),
    }
    for sent in eager_and_jit(compressor, update):
        for name, x in update.items():
            assert sent[name].dtype == x.dtype
            np.testing.assert_array_equal(sent[name].view(np.uint32), reference(x).view(np.uint32))


def test_cast_float32_rounds_a_float64_update_as_float32_would():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        x = rng.normal(size=1000) * 10.0 ** rng.integers(-45, 39, 1000)
        for sent in eager_and_jit(cast("float32"), {"w": x}):
            assert sent["w"].dtype == np.float64
            np.testing.assert_array_equal(sent["w"], np_cast(x, np.float32))
            assert not np.array_equal(sent["w"], x)


@pytest.mark.parametrize("scaled", [False, True])
def test_sign_matches_numpy(scaled):
    update = dyadic(1)
    update["b"] = np.array([0.0, -0.0, -0.5, 2.0], np.float32)  # sign(+-0) = +1
    for sent in eager_and_jit(sign(scaled=scaled), update):
        for name, x in update.items():
            np.testing.assert_array_equal(sent[name], np_sign(x, scaled))
        if not scaled:
            np.testing.assert_array_equal(sent["b"], [1, 1, -1, 1])


@pytest.mark.parametrize("fraction", [0.01, 0.25, 0.5, 1.0])
def test_top_k_matches_numpy_with_ties_to_the_lower_index(fraction):
    update = dyadic(2, {"w": (6, 5), "b": (4,), "s": ()})
    update["b"] = np.array([1.0, -3.0, 3.0, -3.0], np.float32)
    for sent in eager_and_jit(top_k(fraction), update):
        for name, x in update.items():
            np.testing.assert_array_equal(sent[name], np_top_k(x, fraction))
        if fraction == 0.5:  # k = 2 of b: the first two of the three tied |3|
            np.testing.assert_array_equal(sent["b"], [0.0, -3.0, 3.0, 0.0])


def test_error_feedback_top_k_matches_numpy_over_rounds():
    compressor = error_feedback(top_k(0.25))
    updates = [dyadic(10 + t) for t in range(4)]
    state = compressor.init(jax.tree.map(jnp.asarray, updates[0]))
    residual = {name: np.zeros_like(x) for name, x in updates[0].items()}
    for t, update in enumerate(updates):
        sent, state = compressor.apply(jax.tree.map(jnp.asarray, update), state, jax.random.key(t))
        for name, u in update.items():
            corrected = u + residual[name]
            expected = np_top_k(corrected, 0.25)
            residual[name] = corrected - expected
            np.testing.assert_array_equal(sent[name], expected)
            np.testing.assert_array_equal(state.residual[name], residual[name])


# ---------------------------------------------------------------- unbiasedness


def draws(compressor, update) -> dict[str, np.ndarray]:
    """``SAMPLES`` decoded updates, ``[SAMPLES, ...]`` per leaf, in float64."""
    keys = jax.random.split(jax.random.key(42), SAMPLES)
    update = jax.tree.map(jnp.asarray, update)
    sent = jax.jit(jax.vmap(lambda key: compressor.apply(update, (), key)[0]))(keys)
    return jax.tree.map(lambda x: np.asarray(x, np.float64), sent)


def hoeffding(width: np.ndarray, tests: int) -> np.ndarray:
    """Half-width t with P(|mean of SAMPLES - expectation| >= t) <= ALPHA / tests, for
    draws in an interval of ``width`` (Hoeffding: 2 exp(-2 n t^2 / width^2))."""
    return width * np.sqrt(np.log(2 * tests / ALPHA) / (2 * SAMPLES))


def flat(tree, *leading: int) -> np.ndarray:
    """Every leaf's coordinates side by side, ``[*leading, coordinates]``, in float64."""
    leaves = [np.reshape(np.asarray(x, np.float64), (*leading, -1)) for x in jax.tree.leaves(tree)]
    return np.concatenate(leaves, axis=-1)


def assert_unbiased(samples, update, width) -> None:
    """Every coordinate's mean is within its Hoeffding bound (Bonferroni over all of them).

    ``samples`` is ``draws``'s; ``width`` is update-shaped: the width of the interval
    holding each decoded coordinate.
    """
    samples, u, width = flat(samples, SAMPLES), flat(update), flat(width)
    bound = hoeffding(width, u.size) + ROUNDING * np.abs(u)
    error = np.abs(samples.mean(axis=0) - u)
    assert np.all(error <= bound), f"largest error / bound: {np.max(error / bound):.2f}"


def qsgd_width(u: np.ndarray, levels: int) -> np.ndarray:
    """Each coordinate of Q_s(u) is one of two adjacent levels, ||u|| / s apart."""
    return np.full(u.shape, np.linalg.norm(u.astype(np.float64)) / levels)


def qsgd_variance(u: np.ndarray, levels: int) -> float:
    """E||Q_s(u) - u||^2 = (||u|| / s)^2 Σ_i p_i (1 - p_i), p_i = frac(s |u_i| / ||u||)."""
    u = u.astype(np.float64)
    norm = np.linalg.norm(u)
    scaled = levels * np.abs(u) / norm
    p = scaled - np.floor(scaled)
    return float((norm / levels) ** 2 * np.sum(p * (1 - p)))


@pytest.mark.parametrize("levels", [1, 2, 5])
def test_qsgd_is_unbiased_with_the_variance_of_lemma_3_1(levels):
    update = gaussian(3)
    update["b"] = np.array([1.0, -1.0, 1.0, -1.0], np.float32)  # the most variance for s = 1
    samples = draws(qsgd(levels), update)
    assert_unbiased(samples, update, {k: qsgd_width(u, levels) for k, u in update.items()})
    for name, u in update.items():
        d, norm2 = u.size, float(np.sum(np.square(u.astype(np.float64))))
        squared_error = np.sum((samples[name] - u).reshape(SAMPLES, -1) ** 2, axis=1)
        # each squared error lies in [0, d (||u|| / s)^2]
        tolerance = hoeffding(np.float64(d * norm2 / levels**2), 1)
        empirical, exact = squared_error.mean(), qsgd_variance(u, levels)
        assert abs(empirical - exact) <= tolerance, f"{name}: {empirical} against {exact}"
        assert empirical <= min(d / levels**2, math.sqrt(d) / levels) * norm2


def test_terngrad_is_unbiased():
    update = gaussian(4)
    samples = draws(terngrad(), update)
    widths = {}
    for name, u in update.items():
        scale = float(np.max(np.abs(u)))  # decoded values: -scale, 0 or scale
        assert set(np.unique(np.abs(samples[name]))) <= {0.0, scale}
        widths[name] = np.full(u.shape, scale)
    assert_unbiased(samples, update, widths)


def test_random_k_is_unbiased_and_sends_k_values():
    update = gaussian(5)
    fraction = 0.25
    samples = draws(random_k(fraction), update)
    widths = {}
    for name, u in update.items():
        d = u.size
        k = max(1, math.ceil(fraction * d))
        assert np.all(np.count_nonzero(samples[name].reshape(SAMPLES, -1), axis=1) == k)
        widths[name] = d / k * np.abs(u.astype(np.float64))  # decoded: 0 or (d / k) u_i
    assert_unbiased(samples, update, widths)
    with pytest.raises(AssertionError):  # the check has power: a 25% bias is caught
        assert_unbiased(jax.tree.map(lambda x: 1.25 * x, samples), update, widths)


def test_unbiased_flags():
    flags = {
        c.name: c.unbiased
        for c in (identity(), cast("float16"), qsgd(2), terngrad(), sign(), top_k(0.1))
        + (random_k(0.1), error_feedback(random_k(0.1)), chain(random_k(0.5), qsgd(1)))
        + (chain(top_k(0.5), qsgd(1)),)
    }
    assert flags == {
        "identity()": True,
        "cast(float16)": False,
        "qsgd(2)": True,
        "terngrad()": True,
        "sign(scaled=False)": False,
        "top_k(0.1)": False,
        "random_k(0.1)": True,
        "error_feedback(random_k(0.1))": False,
        "chain(random_k(0.5), qsgd(1))": True,
        "chain(top_k(0.5), qsgd(1))": False,
    }


# ---------------------------------------------------------------- bits


# {"w": (3, 4), "b": (4,)}: d = 12 and 4, ceil(log2 12) = 4 and ceil(log2 4) = 2 index bits.
HAND_COUNTS = [
    (identity(), 12 * 32 + 4 * 32),
    (cast("float16"), 12 * 16 + 4 * 16),
    (cast("bfloat16"), 12 * 16 + 4 * 16),
    (qsgd(1), (32 + 12 * (1 + 1)) + (32 + 4 * (1 + 1))),  # ceil(log2 2) = 1
    (qsgd(3), (32 + 12 * (1 + 2)) + (32 + 4 * (1 + 2))),  # ceil(log2 4) = 2
    (qsgd(4), (32 + 12 * (1 + 3)) + (32 + 4 * (1 + 3))),  # ceil(log2 5) = 3
    (terngrad(), (12 * 2 + 32) + (4 * 2 + 32)),
    (sign(), 12 + 4),
    (sign(scaled=True), (12 + 32) + (4 + 32)),
    (top_k(0.25), (3 * 32 + 3 * 4) + (1 * 32 + 1 * 2)),  # k = 3 and 1
    (top_k(0.01), (1 * 32 + 1 * 4) + (1 * 32 + 1 * 2)),  # k = max(1, ...)
    (random_k(0.5), (6 * 32 + 32) + (2 * 32 + 32)),  # k = 6 and 2, a seed each
    (error_feedback(top_k(0.25)), (3 * 32 + 3 * 4) + (1 * 32 + 1 * 2)),
    (chain(top_k(0.25), cast("float16")), (3 * 16 + 3 * 4) + (1 * 16 + 1 * 2)),
    (chain(top_k(0.25), qsgd(1)), (3 * 2 + 3 * 4 + 32) + (1 * 2 + 1 * 2 + 32)),
    (chain(random_k(0.5), sign(scaled=True)), (6 * 1 + 32 + 32) + (2 * 1 + 32 + 32)),
    (error_feedback(chain(top_k(0.25), cast("float16"))), (3 * 16 + 3 * 4) + (1 * 16 + 1 * 2)),
]


@pytest.mark.parametrize(("compressor", "expected"), HAND_COUNTS, ids=lambda c: str(c)[:40])
def test_bits_match_a_hand_count(compressor, expected):
    assert bits(compressor, STRUCTS) == expected
    assert bytes_sent(compressor, STRUCTS) == math.ceil(expected / 8)
    arrays = {name: jnp.zeros(shape) for name, shape in SHAPES.items()}
    assert bits(compressor, arrays) == expected


def test_wire_widths_of_leaves():
    """Floats start at their width capped at 32 bits; other leaves count at their width."""
    shapes = {
        "f64": jax.ShapeDtypeStruct((5,), jnp.float64),  # float64 runs model float32 on the wire
        "bf16": jax.ShapeDtypeStruct((5,), jnp.bfloat16),
        "count": jax.ShapeDtypeStruct((), jnp.int32),
        "flags": jax.ShapeDtypeStruct((3,), jnp.int8),
        "empty": jax.ShapeDtypeStruct((0, 4), jnp.float32),
    }
    assert bits(identity(), shapes) == 5 * 32 + 5 * 16 + 32 + 3 * 8
    assert bits(qsgd(1), shapes) == (32 + 5 * 2) * 2 + 32 + 3 * 8
    assert bytes_sent(sign(), shapes) == math.ceil((5 + 5 + 32 + 3 * 8) / 8)


def test_top_k_counts_the_fraction_as_written():
    """0.07 * 100 is 7.000000000000001 in floats: k is still 7."""
    assert top_k(0.07).payload(Payload(100, 32), 100) == Payload(7, 32, 7 * 7)
    assert random_k(0.07).payload(Payload(100, 32), 100) == Payload(7, 32, 32)
    assert Payload(7, 32, 49).bits == 7 * 32 + 49


# ---------------------------------------------------------------- error feedback


@pytest.mark.parametrize(
    "inner", [top_k(0.25), sign(scaled=True), qsgd(1), chain(random_k(0.5), cast("bfloat16"))]
)
def test_error_feedback_conserves_mass(inner):
    """Σ_t sent_t + e_T = Σ_t u_t, to float32 rounding: a round rounds twice (p = u + e and
    e' = p - c), each within half an ulp of the largest |p| or |e'|; the sums are float64.
    The tolerance, the sum of those half ulps over 6 rounds, is below 1e-5 here."""
    compressor = error_feedback(inner)
    updates = [gaussian(20 + t) for t in range(6)]
    state = compressor.init(jax.tree.map(jnp.asarray, updates[0]))
    apply = jax.jit(compressor.apply)
    total_sent, tolerance = 0.0, 0.0
    for t, update in enumerate(updates):
        corrected = flat(update) + flat(state.residual)
        sent, state = apply(jax.tree.map(jnp.asarray, update), state, jax.random.key(t))
        total_sent = total_sent + flat(sent)
        for x in (corrected, flat(state.residual)):
            tolerance += np.spacing(np.max(np.abs(x)).astype(np.float32)) / 2
    assert tolerance < 1e-5
    total_in = sum(flat(u) for u in updates)
    np.testing.assert_allclose(total_sent + flat(state.residual), total_in, rtol=0, atol=tolerance)
    assert all(np.any(state.residual[name] != 0) for name in SHAPES)  # something held back


# ---------------------------------------------------------------- transforms and leaves


ALL = [
    identity(),
    cast("float16"),
    qsgd(3),
    terngrad(),
    sign(),
    sign(scaled=True),
    top_k(0.25),
    random_k(0.5),
    error_feedback(top_k(0.25)),
    error_feedback(sign(scaled=True)),
    chain(top_k(0.5), qsgd(2)),
    chain(error_feedback(random_k(0.5)), cast("bfloat16")),
]


@pytest.mark.parametrize("compressor", ALL, ids=lambda c: c.name)
def test_vmap_over_clients_equals_per_client_calls_bitwise(compressor):
    """Also for a [37, 53] leaf, whose plain jnp.sum changes by an ulp under vmap."""
    clients = 3
    updates = [gaussian(30 + c, {**SHAPES, "odd": (37, 53)}) for c in range(clients)]
    keys = jax.random.split(jax.random.key(7), clients)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *updates)
    states = jax.vmap(compressor.init)(stacked)
    one_client, cohort = jax.jit(compressor.apply), jax.jit(jax.vmap(compressor.apply))
    for _ in range(2):  # the second round starts from non-zero error-feedback residuals
        sent, new_states = cohort(stacked, states, keys)
        for c in range(clients):
            one = jax.tree.map(lambda x, c=c: x[c], (stacked, states))
            expected = one_client(*one, keys[c])
            got = jax.tree.map(lambda x, c=c: x[c], (sent, new_states))
            jax.tree.map(np.testing.assert_array_equal, got, expected)
        states = new_states


@pytest.mark.parametrize("compressor", ALL, ids=lambda c: c.name)
def test_non_float_leaves_pass_through_and_dtypes_are_kept(compressor):
    update = {
        "w": jnp.asarray(gaussian(40)["w"]),
        "half": jnp.linspace(-1, 1, 6, dtype=jnp.float16),
        "steps": jnp.array([3, -1], jnp.int32),
        "empty": jnp.zeros((0,), jnp.float32),
    }
    sent, _ = compressor.apply(update, compressor.init(update), jax.random.key(0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), sent) == jax.tree.map(
        lambda x: (x.shape, x.dtype), update
    )
    np.testing.assert_array_equal(sent["steps"], update["steps"])


def test_leaves_and_stages_draw_independent_keys():
    """Two equal leaves get different coordinates; the same key gives the same draw; stage i
    of a chain draws with fold_in(key, i)."""
    update = {"a": jnp.arange(1.0, 101.0), "b": jnp.arange(1.0, 101.0)}
    first = compress(random_k(0.1), update, key=3)
    assert not np.array_equal(first["a"], first["b"])
    jax.tree.map(np.testing.assert_array_equal, compress(random_k(0.1), update, key=3), first)
    twice = chain(random_k(0.5), random_k(0.5))
    sent, _ = twice.apply(update, twice.init(update), jax.random.key(3))
    stage, key = random_k(0.5), jax.random.key(3)
    first, _ = stage.apply(update, (), jax.random.fold_in(key, 0))
    expected, _ = stage.apply(first, (), jax.random.fold_in(key, 1))
    jax.tree.map(np.testing.assert_array_equal, sent, expected)


# ---------------------------------------------------------------- options and docs


@pytest.mark.parametrize(
    ("factory", "option"),
    [
        (lambda: qsgd(0), "levels"),
        (lambda: qsgd(2.5), "levels"),
        (lambda: qsgd(True), "levels"),
        (lambda: top_k(0), "fraction"),
        (lambda: top_k(1.5), "fraction"),
        (lambda: top_k(float("nan")), "fraction"),
        (lambda: random_k(-0.1), "fraction"),
        (lambda: random_k("0.5"), "fraction"),
        (lambda: cast("float64"), "dtype"),
        (lambda: cast("int8"), "dtype"),
        (lambda: cast("half-precision"), "dtype"),
        (lambda: cast("float8_e4m3fn"), "dtype"),
        (lambda: chain(), "compressor"),
    ],
)
def test_impossible_options_are_one_line_value_errors(factory, option):
    with pytest.raises(ValueError, match=option) as err:
        factory()
    assert "\n" not in str(err.value)


def test_docstring_examples():
    result = doctest.testmod(compression)
    assert result.attempted > 0
    assert result.failed == 0
