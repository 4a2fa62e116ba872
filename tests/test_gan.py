"""The conditional WGAN-GP and its sequential training within groups.

Losses are checked against a float64 numpy forward pass of the same weights
with central finite differences for the critic's input gradient; the scan
over member slots against a plain per-client Python loop, and its split into calls (for the
progress bar) bit for bit against one scan.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import rng
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.gandalf import gan as gan_lib
from fedjax_het.gandalf import pipeline as gandalf
from fedjax_het.gandalf import rebalance


def np_mlp(params, h):
    """Float64 forward pass of a Flax Dense stack with leaky ReLU (0.2) between layers."""
    layers = params["params"]
    names = sorted(layers, key=lambda name: int(name.split("_")[1]))
    for i, name in enumerate(names):
        h = h @ np.asarray(layers[name]["kernel"], np.float64) + np.asarray(
            layers[name]["bias"], np.float64
        )
        if i < len(names) - 1:
            h = np.where(h > 0, h, 0.2 * h)
    return h


def np_critic(params, x, labels, num_classes):
    return np_mlp(params, np.concatenate([x, np.eye(num_classes)[labels]], axis=1))[:, 0]


def np_input_grad(params, x, labels, num_classes, eps=1e-6):
    grads = np.zeros_like(x)
    for i in range(x.shape[1]):
        step = np.zeros_like(x)
        step[:, i] = eps
        up = np_critic(params, x + step, labels, num_classes)
        down = np_critic(params, x - step, labels, num_classes)
        grads[:, i] = (up - down) / (2 * eps)
    return grads


def test_gradient_penalty_of_a_linear_critic_is_closed_form():
    """``D(x, y) = w.x + v_y`` has gradient ``w`` everywhere: penalty ``(||w|| - 1)^2``."""
    with jax.enable_x64(True):
        w = jnp.array([0.3, -1.2, 2.0], jnp.float64)
        v = jnp.array([5.0, -3.0], jnp.float64)
        x_hat = jax.random.normal(jax.random.key(0), (6, 3), jnp.float64)
        labels = jnp.array([0, 1, 1, 0, 1, 0])
        got = gan_lib.gradient_penalty(lambda x, y: x @ w + v[y], x_hat, labels)
        expected = (np.sqrt(np.sum(np.asarray(w) ** 2)) - 1.0) ** 2
        np.testing.assert_allclose(np.asarray(got), np.full(6, expected), rtol=1e-13, atol=0)


@pytest.mark.parametrize("gp_weight", [10.0, 0.0])
def test_losses_match_a_float64_forward_pass_with_finite_differences(gp_weight):
    gan = gan_lib.wgan_gp(5, 3, hidden=(7, 6), latent_dim=4, gp_weight=gp_weight)
    with jax.enable_x64(True):
        state = jax.tree.map(lambda p: p.astype(jnp.float64), gan.init(jax.random.key(3)))
        keys = jax.random.split(jax.random.key(4), 3)
        x = jax.random.normal(keys[0], (8, 5), jnp.float64)
        z = jax.random.normal(keys[1], (8, 4), jnp.float64)
        gamma = jax.random.uniform(keys[2], (8,), jnp.float64)
        labels = jnp.array([0, 1, 2, 2, 1, 0, 0, 2])
        loss, (wasserstein, penalty) = jax.jit(gan.critic_loss)(
            state.critic, state.generator, x, labels, z, gamma
        )
        generator_loss = jax.jit(gan.generator_loss)(state.generator, state.critic, labels, z)
    x, z, gamma, labels = (np.asarray(a) for a in (x, z, gamma, labels))
    fake = np_mlp(state.generator, np.concatenate([z, np.eye(3)[labels]], axis=1))
    real_score = np_critic(state.critic, x, labels, 3)
    fake_score = np_critic(state.critic, fake, labels, 3)
    x_hat = gamma[:, None] * x + (1 - gamma[:, None]) * fake
    norms = np.linalg.norm(np_input_grad(state.critic, x_hat, labels, 3), axis=1)
    expected_penalty = np.mean((norms - 1.0) ** 2)
    expected_w = real_score.mean() - fake_score.mean()
    np.testing.assert_allclose(float(penalty), expected_penalty, rtol=1e-7)
    np.testing.assert_allclose(float(wasserstein), expected_w, rtol=1e-10)
    np.testing.assert_allclose(float(loss), -expected_w + gp_weight * expected_penalty, rtol=1e-7)
    np.testing.assert_allclose(float(generator_loss), -fake_score.mean(), rtol=1e-10)


def two_class_clients(sizes, seed=0):
    """Clients of 4 features: class 0 around +2, class 1 around -2 (std 0.3)."""
    draws = np.random.default_rng(seed)
    xs, ys = [], []
    for size in sizes:
        y = draws.integers(0, 2, size=size)
        xs.append(draws.normal(size=(size, 4)) * 0.3 + np.where(y[:, None] == 0, 2.0, -2.0))
        ys.append(y)
    return ClientArrays.from_clients([x.astype(np.float32) for x in xs], ys)


def test_scan_over_members_matches_a_per_client_loop():
    """Ragged groups (padding slots) and a skipped one-example client, against a Python loop."""
    train = two_class_clients([6, 1, 9, 4, 5])
    groups = np.array([0, 1, 0, 1, 0])  # group 1: client 1 is skipped, client 3 alone
    gan = gan_lib.wgan_gp(4, 2, hidden=(8,), latent_dim=3, critic_lr=1e-2, generator_lr=1e-2)
    key = jax.random.key(11)
    states, metrics = gan_lib.train_sequential(gan, train, groups, key=key, passes=2, batch_size=8)
    assert metrics.wasserstein.shape == (2, 2 * 3)
    assert np.isnan(np.asarray(metrics.wasserstein[1])).tolist() == [False, True, True] * 2
    x = jnp.asarray(train.x)
    y = jnp.asarray(train.y)
    client_visit = jax.jit(gan.client_visit, static_argnums=6)
    for g, members in ((0, [0, 2, 4]), (1, [3])):
        state = gan.init(rng.client_key(rng.stream(key, "gan_init"), g))
        for p in range(2):
            for k in members:
                visit_key = rng.client_key(rng.round_key(rng.stream(key, "gan_train"), p), k)
                state, _ = client_visit(state, x, y, train.offset[k], train.count[k], visit_key, 8)
        got = jax.tree.map(lambda leaf, g=g: leaf[g], states)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def one_scan(gan, train, members, key, passes, batch_size):
    """Reference: the visits as ONE jitted program, ``vmap`` over groups of a ``lax.scan`` over
    all ``passes * S`` member slots (the GAN phase before it was split into calls)."""
    x, y = jnp.asarray(train.x), jnp.asarray(train.y)
    offset, count = jnp.asarray(train.offset), jnp.asarray(train.count)
    train_stream = rng.stream(key, "gan_train")
    passes_idx = jnp.repeat(jnp.arange(passes), members.shape[1])

    def one_group(group_id, member_ids):
        def visit(state, slot):
            pass_idx, client = slot
            k = jnp.maximum(client, 0)
            visit_key = rng.client_key(rng.round_key(train_stream, pass_idx), k)
            new, metrics = gan.client_visit(state, x, y, offset[k], count[k], visit_key, batch_size)
            keep = lambda a, b: jnp.where(client >= 0, a, b)
            nan = lambda m: jnp.where(client >= 0, m, jnp.nan)
            return jax.tree.map(keep, new, state), jax.tree.map(nan, metrics)

        state = gan.init(rng.client_key(rng.stream(key, "gan_init"), group_id))
        return jax.lax.scan(visit, state, (passes_idx, jnp.tile(member_ids, passes)))

    return jax.jit(jax.vmap(one_group))(jnp.arange(members.shape[0]), jnp.asarray(members))


def test_visits_split_into_calls_are_the_bits_of_one_scan():
    """3 ragged groups (sizes 3, 2, 1: padding slots), 2 passes = 6 visits a group, split
    into calls of 1 visit (the default for so few) and of 4 (the last call padded): the same
    bits as one scan."""
    train = two_class_clients([5, 4, 6, 3, 7, 4])
    groups = np.array([0, 1, 0, 2, 1, 0])
    gan = gan_lib.wgan_gp(4, 2, hidden=(6,), latent_dim=3, critic_lr=1e-2, generator_lr=1e-2)
    key = jax.random.key(7)
    members = gan_lib.group_members(groups, train.count)
    assert members.shape == (3, 3)
    want = one_scan(gan, train, members, key, passes=2, batch_size=8)
    assert np.asarray(want[1].wasserstein).shape == (3, 6)
    for visits_per_call in (None, 4):
        got = gan_lib.train_sequential(
            gan, train, groups, key=key, passes=2, batch_size=8, visits_per_call=visits_per_call
        )
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_thirty_steps_are_deterministic_and_the_critic_finds_the_gap():
    """30 generator steps (5 clients x 2 passes x T_g = 3): same key, same bits; the
    critic's Wasserstein estimate rises from ~0 at the random initialisation (the
    generator starts near 0, the data sits at +-2 in 4 features) and the
    generated class means move toward the data's."""
    train = two_class_clients([16] * 5)
    groups = np.zeros(5, dtype=np.int32)
    gan = gan_lib.wgan_gp(4, 2, hidden=(32,), latent_dim=4, critic_lr=1e-2, generator_lr=3e-3)
    key = jax.random.key(0)
    states, metrics = gan_lib.train_sequential(gan, train, groups, key=key, passes=2, batch_size=64)
    again, _ = gan_lib.train_sequential(gan, train, groups, key=key, passes=2, batch_size=64)
    for a, b in zip(jax.tree.leaves(states), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other, _ = gan_lib.train_sequential(
        gan, train, groups, key=jax.random.key(1), passes=2, batch_size=64
    )
    assert not np.array_equal(
        np.asarray(other.generator["params"]["Dense_0"]["kernel"]),
        np.asarray(states.generator["params"]["Dense_0"]["kernel"]),
    )
    wasserstein = np.asarray(metrics.wasserstein[0])
    assert abs(wasserstein[0]) < 1.0
    assert wasserstein[1:].max() > wasserstein[0] + 2.0

    labels = np.repeat([0, 1], 200)
    start = gan.init(rng.client_key(rng.stream(key, "gan_init"), 0))
    trained = jax.tree.map(lambda leaf: leaf[0], states)

    def mean_error(state):
        made = np.asarray(gan.generate(state.generator, jax.random.key(5), labels))
        return np.abs(made[:200].mean(0) - 2.0).mean() + np.abs(made[200:].mean(0) + 2.0).mean()

    assert mean_error(trained) < mean_error(start) - 0.3

    (hook,) = gan_lib.generators(gan, states)  # labels padded to 4 rows, then trimmed
    made = np.asarray(hook(jax.random.key(2), np.array([1, 0, 1])))
    assert made.shape == (3, 4) and made.dtype == np.float32
    np.testing.assert_array_equal(made, np.asarray(hook(jax.random.key(2), np.array([1, 0, 1]))))
    assert np.asarray(hook(jax.random.key(2), np.array([], np.int32))).shape == (0, 4)


def test_gandalf_data_end_to_end():
    """Two label mixes, two groups: every client ends with more of its minority class."""
    draws = np.random.default_rng(4)
    xs, ys = [], []
    for k in range(4):
        y = draws.choice(2, size=20, p=[0.8, 0.2] if k % 2 else [0.2, 0.8])
        xs.append(draws.normal(size=(20, 2, 2)).astype(np.float32))
        ys.append(y)
    data = FederatedData.from_client_arrays(xs, ys, num_classes=2)
    options = gandalf.gandalf_options(tau=1.0, gan_hidden=(8,), gan_batch_size=16)
    out = gandalf.gandalf_data(data, options, seed=0)
    before = rebalance.class_counts(data.train, 2)
    after = rebalance.class_counts(out.data.train, 2)
    assert out.data.example_shape == (2, 2)
    np.testing.assert_array_equal(after.max(1), before.max(1))
    assert np.all(after.min(1) > before.min(1))
    assert out.synthetic.sum() == (after - before).sum()


def test_bad_inputs():
    for kwargs, match in (
        ({"critic_steps": 0}, "critic_steps"),
        ({"latent_dim": 0}, "latent_dim"),
        ({"output": "relu"}, "output"),
        ({"critic_lr": 0.0}, "critic_lr"),
        ({"gp_weight": -1.0}, "gp_weight"),
        ({"hidden": (4, 0)}, "hidden"),
    ):
        with pytest.raises(ValueError, match=match):
            gan_lib.wgan_gp(4, 2, **kwargs)
    gan = gan_lib.wgan_gp(4, 2, hidden=(4,))
    train = two_class_clients([3, 1, 4])
    with pytest.raises(ValueError, match="group\\(s\\) \\[1\\] have no client with >= 2"):
        gan_lib.train_sequential(gan, train, np.array([0, 1, 0]), key=jax.random.key(0))
    with pytest.raises(ValueError, match="features"):
        gan_lib.train_sequential(
            gan_lib.wgan_gp(5, 2), train, np.zeros(3, int), key=jax.random.key(0)
        )
    with pytest.raises(ValueError, match="groups"):
        gan_lib.train_sequential(gan, train, np.zeros(2, int), key=jax.random.key(0))
    with pytest.raises(ValueError, match="passes"):
        gan_lib.train_sequential(gan, train, np.zeros(3, int), key=jax.random.key(0), passes=0)
    with pytest.raises(ValueError, match="visits_per_call"):
        gan_lib.train_sequential(
            gan, train, np.zeros(3, int), key=jax.random.key(0), visits_per_call=0
        )
