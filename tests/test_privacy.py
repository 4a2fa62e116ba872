"""DP-FedAvg (``fedjax_het.transforms.privacy``): clipping, noise and the accountant, each against an
independent computation.

- Four rounds of DP-FedAvg without noise against a float64 per-client sequential
  reference (``test_scaffold_feddyn.run_rounds``: ragged clients, step limits, a
  weight-0 client that trains, a round nobody counts): each counted update
  clipped to ``C`` in numpy, summed, divided by the cohort size: rtol 1e-5, atol 1e-6.
- With noise the round moves by exactly the server's draw over the cohort size
  (the draw comes from the round's server key; rtol 1e-5).
- The noise is N(0, (z C)^2): mean and standard deviation of 200,000 draws within
  5 standard errors (false alarm about 6e-7 per check under the normal
  approximation); clipping gives norm ``C`` to rtol 1e-6 and leaves small updates bitwise.
- The accountant's ε for the unsubsampled Gaussian mechanism equals the closed
  form: RDP ``T α / (2 z^2)`` (Mironov 2017, Proposition 7 and composition),
  converted as in Balle et al. 2020 (Proposition 12), minimised over the orders.
- Adaptive clipping (Andrew et al. 2021): one server round equals the geometric
  update with the engine's two noise draws; without noise the clip settles at the
  median update norm.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scaffold_feddyn as reference

from fedjax_het import rng
from fedjax_het.algorithms import fedavg, scaffold
from fedjax_het.engine.hooks import RunReport, ServerMetrics
from fedjax_het.engine.round import server_stream
from fedjax_het.front.config import ConfigError, build, load
from fedjax_het.transforms import privacy
from fedjax_het.transforms.privacy import ClippedUpdate, add_noise, clip, epsilon, private

CLIP = 0.05  # clips some of the reference's client updates and not others
COHORT = 3  # the reference's rounds have three slots


def clipped_client(norms):
    def client(data, server, state):
        """Plain SGD from x; the update x - y is clipped to CLIP in float64."""
        x = server["x"]
        trained, loss_sum = reference.reference_sgd(
            x, data, reference.CLIENT_LR, lambda p: reference.zeros_like(p)
        )
        delta = jax.tree.map(np.subtract, x, trained)
        norm = math.sqrt(sum(float(np.sum(d**2)) for d in jax.tree.leaves(delta)))
        norms.append(norm)
        scale = min(1.0, CLIP / norm) if norm > 0 else 1.0
        seen = jax.tree.map(lambda a, d: a - scale * d, x, delta)
        return seen, state, loss_sum

    return client


def fixed_denominator_server(server, clients):
    """x - η_g Σ_{w_k > 0} clipped_k / m: every counted client once, divided by the cohort size."""
    x = server["x"]
    total = reference.zeros_like(x)
    for seen, _, _, w in clients:
        if w > 0:
            total = jax.tree.map(lambda t, a, b: t + (a - b), total, x, seen)
    return {"x": jax.tree.map(lambda a, t: a - reference.SERVER_LR * t / COHORT, x, total)}


def test_dp_fedavg_without_noise_matches_sequential_reference():
    norms = []
    algorithm = private(fedavg(), cohort_size=COHORT, clip_norm=CLIP, noise_multiplier=0.0)
    hyper = {"client_lr": reference.CLIENT_LR, "server_lr": reference.SERVER_LR}
    reference.run_rounds(
        algorithm, hyper, reference.rng.seed_key(3), clipped_client(norms),
        fixed_denominator_server, lambda x: {}, client_state=lambda x: (),
    )  # fmt: skip
    assert min(norms) < CLIP < max(norms)  # some updates were clipped, some not


def one_round(noise: float):
    algorithm = private(fedavg(), cohort_size=COHORT, clip_norm=CLIP, noise_multiplier=noise)
    key, train = reference.rng.seed_key(7), reference.device_split(reference.make_store())
    ids, limits, weights = reference.ROUNDS[0]
    tasks = reference.make_tasks(0, ids, limits, weights, key)
    hyper = algorithm.hyper({"client_lr": reference.CLIENT_LR, "server_lr": reference.SERVER_LR})
    state = reference.start(algorithm, reference.LOGREG, hyper, key)
    new, _, _ = reference.train_cohort(
        reference.make_round(algorithm), state, jnp.asarray(ids, jnp.int32), tasks, hyper, train,
        server_stream(key, jnp.int32(0)),
    )  # fmt: skip
    return algorithm.global_params(new.server_state), key


def test_the_noise_is_the_servers_draw_over_the_cohort_size():
    quiet, key = one_round(0.0)
    noisy, _ = one_round(2.0)
    draw = add_noise(jax.tree.map(jnp.zeros_like, quiet), 2.0 * CLIP, server_stream(key, 0))
    want = jax.tree.map(lambda q, n: q - reference.SERVER_LR * n / COHORT, quiet, draw)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7), noisy, want)


def test_the_round_needs_a_server_key():
    algorithm = private(fedavg(), cohort_size=2)
    with pytest.raises(ValueError, match="server key"):
        algorithm.server_update(None, {}, algorithm.hyper(), None)


def test_noise_has_the_stated_mean_and_standard_deviation():
    n, std = 200_000, 0.7
    sample = np.asarray(add_noise({"w": jnp.zeros((n,))}, jnp.float32(std), jax.random.key(1))["w"])
    assert abs(sample.mean()) < 5 * std / math.sqrt(n)
    assert abs(sample.std() - std) < 5 * std / math.sqrt(2 * n)


def test_clipping_scales_large_updates_to_the_norm_and_leaves_small_ones():
    large = {"a": jnp.full((3, 4), 2.0), "b": jnp.full((5,), -1.0)}
    clipped = clip(large, jnp.float32(0.5))
    norm = math.sqrt(sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(clipped)))
    np.testing.assert_allclose(norm, 0.5, rtol=1e-6)
    np.testing.assert_allclose(clipped["a"] / clipped["b"][0], large["a"] / large["b"][0])
    small = {"a": jnp.full((2,), 0.1)}
    jax.tree.map(np.testing.assert_array_equal, clip(small, jnp.float32(1.0)), small)
    jax.tree.map(np.testing.assert_array_equal, clip({"a": jnp.zeros(3)}, 1.0), {"a": jnp.zeros(3)})


def closed_form_gaussian_epsilon(z: float, rounds: int, delta: float) -> float:
    """min over α of T α/(2 z^2) + log(1 - 1/α) - (log δ + log α)/(α - 1), at least 0."""
    best = math.inf
    for alpha in privacy.ORDERS:
        rdp = rounds * alpha / (2 * z**2)
        eps = rdp + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
        best = min(best, max(eps, 0.0))
    return best


@pytest.mark.parametrize("z, rounds", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_unsubsampled_gaussian_epsilon_is_the_closed_form(z, rounds):
    got = epsilon(z, rounds, cohort_size=50, num_clients=50, delta=1e-5)
    np.testing.assert_allclose(got, closed_form_gaussian_epsilon(z, rounds, 1e-5), rtol=1e-9)


def test_epsilon_grows_with_rounds_and_falls_with_noise_and_sampling():
    e = lambda z, r, m: epsilon(z, r, m, 1000, 1e-5)
    assert e(1.0, 10, 10) < e(1.0, 100, 10)
    assert e(2.0, 100, 10) < e(1.0, 100, 10)
    assert e(1.0, 100, 10) < e(1.0, 100, 100)
    assert e(1.0, 100, 10) < epsilon(1.0, 100, 10, 1000, 1e-5, fixed_size=True)
    assert epsilon(0.0, 1, 10, 1000, 1e-5) == math.inf and e(1.0, 0, 10) == 0.0
    allowed = privacy.rounds_within(3.0, 1.0, 10, 1000, 1e-5, most=10_000)
    assert e(1.0, allowed, 10) <= 3.0 < e(1.0, allowed + 1, 10)


def test_a_run_reports_its_privacy_and_stops_at_its_budget():
    experiment = build(load(None, ["privacy.noise_multiplier=1.0", "privacy.target_epsilon=4.0"]))
    assert experiment.config["rounds"] == privacy.rounds_within(4.0, 1.0, 10, 100, 1e-5, most=200)
    report = experiment.algorithm.hook(RunReport).report({"dp_noise": 1.0, "dp_clip": 1.0}, 100, 15)
    assert report["privacy"]["epsilon"] == epsilon(1.0, 15, 10, 100, 1e-5)


@pytest.mark.parametrize(
    "override, match",
    [
        ("privacy.noise_multiplier=-1.0", "noise_multiplier"),
        ("privacy.clip_norm=0.0", "clip_norm"),
        ("privacy.delta=1.0", "delta"),
        ("privacy.target_epsilon=0.01", "not one round fits"),
        ("privacy.clip_norm=inf", "clip_norm"),
    ],
)
def test_impossible_privacy_settings_are_one_line_errors(override, match):
    with pytest.raises(ConfigError, match=match) as err:
        build(load(None, [override]))
    assert "\n" not in str(err.value)


def test_an_update_that_is_not_a_model_delta_is_refused():
    algorithm = private(scaffold(), cohort_size=COHORT)
    with pytest.raises(ValueError, match="more than a model delta"):
        one_round_of(algorithm)


def one_round_of(algorithm):
    key, train = reference.rng.seed_key(7), reference.device_split(reference.make_store())
    ids, limits, weights = reference.ROUNDS[0]
    tasks = reference.make_tasks(0, ids, limits, weights, key)
    hyper = algorithm.hyper()
    state = reference.start(algorithm, reference.LOGREG, hyper, key)
    reference.train_cohort(reference.make_round(algorithm), state, jnp.asarray(ids, jnp.int32),
                           tasks, hyper, train, server_stream(key, jnp.int32(0)))  # fmt: skip


def adaptive_server(**options):
    algorithm = private(fedavg(), cohort_size=10, adaptive=True, **options)
    params = {"w": jnp.zeros((4,), jnp.float32)}
    hyper = algorithm.hyper({"server_lr": 1.0})
    return algorithm, algorithm.server_init(params, hyper, 100), hyper


def test_adaptive_clip_moves_geometrically_towards_the_quantile():
    """One server round against Andrew et al.'s update, with the engine's two noise draws:
    the update's at z_Δ = (z^-2 - (2 σ_b)^-2)^-1/2 and the count's at σ_b = m / 20."""
    algorithm, state, hyper = adaptive_server(noise_multiplier=0.8, clip_norm=0.3, clip_lr=0.2,
                                              target_quantile=0.5)  # fmt: skip
    total = ClippedUpdate({"w": jnp.asarray([0.5, -0.2, 0.1, 0.0])}, jnp.float32(7.0))
    key = jax.random.key(11)
    new = algorithm.server_update(state, total, hyper, key)
    sigma_b, z = 10 / 20, 0.8
    z_delta = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    count = 7.0 + sigma_b * float(jax.random.normal(rng.stream(key, "count")))
    np.testing.assert_allclose(new.clip, 0.3 * math.exp(-0.2 * (count / 10 - 0.5)), rtol=1e-6)
    noise = add_noise({"w": jnp.zeros(4)}, z_delta * 0.3, key)["w"]
    np.testing.assert_allclose(new.inner.params["w"], -(total.delta["w"] + noise) / 10, rtol=1e-5)


def test_adaptive_clip_without_noise_settles_at_the_median_norm():
    """Ten clients with update norms 1..10: the clip settles between the 5th and 6th norm."""
    algorithm, state, hyper = adaptive_server(noise_multiplier=0.0, clip_norm=0.5, clip_lr=0.2)
    norms = np.arange(1.0, 11.0)
    update = jax.jit(algorithm.server_update)
    for r in range(300):
        within = jnp.float32(np.sum(norms <= float(state.clip)))
        state = update(state, ClippedUpdate({"w": jnp.zeros(4)}, within), hyper,
                       jax.random.key(r))  # fmt: skip
    assert 5.0 * 0.9 <= float(state.clip) <= 6.0 * 1.1


def test_adaptive_clipping_from_the_config_records_its_clip_norm():
    experiment = build(load(None, ["privacy.adaptive=true", "privacy.noise_multiplier=0.5",
                                   "privacy.clip_norm=0.1"]))  # fmt: skip
    assert experiment.algorithm.hook(ServerMetrics) is not None
    with pytest.raises(ConfigError, match=r"privacy.adaptive = true needs privacy.noise_multiplier below 2 x privacy.count_noise") as err:
        build(load(None, ["privacy.adaptive=true", "privacy.noise_multiplier=1.5"]))
    assert "\n" not in str(err.value)
