"""Agnostic FedAvg against a float64 per-client sequential reference and FedJAX's values.

The reference (``cohort_reference.check_rounds``) keeps the model ``x`` and the domain
weights ``λ``: before each round, over the clients that count, each domain's mean loss at
``x`` on every row of its clients (``L``) and the sum of their weights (``M``); the clients
run local SGD at 0.1; the server moves ``x`` by 0.7 times the mean of ``x - w_i`` at weights
``n_i λ_d / M_d`` and ``λ`` by projected gradient ascent (the projection found by bisection,
not by sorting as optax does) or exponentiated gradient, nothing when nobody counts. Domains:
one per client, and two domains of two clients. float32 engine: rtol 1e-5, atol 1e-6; float64
engine: rtol 1e-12, atol 1e-13.

From FedJAX's ``agnostic_fed_avg_test``, ``test_update_domain_weights`` is reproduced; its
``apply`` toy gives each *example* a domain, which this implementation's per-client domains
cannot express.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scaffold_feddyn as base
from cohort_reference import (
    N,
    Reference,
    batches,
    check_rounds,
    check_traced,
    cross_entropy,
    weighted_mean,
)

from fedjax_het import rng
from fedjax_het.algorithms.agnostic_fedavg import agnostic_fedavg, domain_step
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.hooks import CohortProbe
from fedjax_het.front.config import ConfigError, build, load

LR, SERVER_LR = base.CLIENT_LR, base.SERVER_LR
SETTINGS = {  # domains, rule, γ
    "own": ((), "projected", 0.5),
    "pairs": ((1, 0, 0, 1), "eg", 0.3),
}


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def project(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection onto the probability simplex: ``max(v - θ, 0)`` with ``θ``
    found by bisection on ``Σ max(v - θ, 0) = 1``."""
    low, high = v.min() - 1.0, v.max()
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if np.maximum(v - mid, 0).sum() > 1 else (low, mid)
    return np.maximum(v - (low + high) / 2, 0)


def afl_reference(domains: tuple[int, ...], rule: str, gamma: float) -> Reference:
    """Agnostic FedAvg in numpy (module docstring)."""
    domain = (lambda k: domains[k]) if domains else (lambda k: k)
    count = max(domains) + 1 if domains else N

    def before(server, counted):
        losses, examples, mass = np.zeros(count), np.zeros(count), np.zeros(count)
        for k, w, data in counted:
            losses[domain(k)] += cross_entropy(server["x"], *data)[1]
            examples[domain(k)] += len(data[1])
            mass[domain(k)] += w
        mean = np.divide(losses, examples, out=np.zeros(count), where=examples > 0)
        return {**server, "losses": mean, "mass": mass}

    def client(k, data, server, state):
        y, loss_sum = server["x"], 0.0
        for batch in batches(data):
            g, loss = cross_entropy(y, *batch)
            y, loss_sum = jax.tree.map(lambda a, d: a - LR * d, y, g), loss_sum + loss
        return y, (), loss_sum

    def after(server, clients):
        x, lam, mass = server["x"], server["weights"], server["mass"]
        pairs = [(base.tree_sub(x, y), w * lam[domain(k)] / mass[domain(k)])
                 for k, y, _, w in clients if w > 0]  # fmt: skip
        mean = weighted_mean(pairs)
        if mean is None:
            return server
        x = jax.tree.map(lambda a, d: a - SERVER_LR * d, x, mean)
        if rule == "projected":
            lam = project(lam + gamma * server["losses"])
        else:
            lam = lam * np.exp(gamma * server["losses"])
            lam = lam / lam.sum()
        return {**server, "x": x, "weights": lam}

    def extras(x):
        return {"weights": np.full(count, 1 / count), "losses": np.zeros(count),
                "mass": np.zeros(count)}  # fmt: skip

    return Reference(extras, lambda x: (), client, after, before)


def check_afl(setting: str, **precision_and_tolerance):
    domains, rule, gamma = SETTINGS[setting]
    algorithm = agnostic_fedavg(domains=domains, domain_update=rule, client_lr=LR,
                                server_lr=SERVER_LR)  # fmt: skip
    server, _ = check_rounds(
        algorithm, {"domain_lr": gamma}, rng.seed_key(12), afl_reference(domains, rule, gamma),
        **precision_and_tolerance,
    )  # fmt: skip
    return server


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_matches_the_sequential_reference(setting):
    """Four rounds: x, λ, L, M and the training loss; λ moved away from uniform."""
    server = check_afl(setting)
    assert np.ptp(server["weights"]) > 1e-2


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_float64_engine_matches_the_reference_to_1e_12(x64, setting):
    check_afl(setting, precision="float64", rtol=1e-12, atol=1e-13)


def test_fedjax_domain_weight_update():
    """FedJAX's test_update_domain_weights ('eg'), float32 (rtol 1e-6: the engine takes a
    softmax of log λ + γ L, FedJAX normalises λ exp(γ L))."""
    moved = domain_step(
        jnp.array([0.1, 0.2, 0.3, 0.4]), jnp.array([10.0, 0.0, 5.0, 0.0]), jnp.float32(0.1), "eg"
    )
    np.testing.assert_allclose(moved, [0.198931, 0.14636526, 0.36197326, 0.2927305], rtol=1e-6)


def test_one_domain_is_fedavg():
    """With every client in one domain, β_i = n_i / M: FedAvg's example-weighted mean."""
    store = base.make_store()
    ids, limits, weights = base.ROUNDS[2]
    key = rng.seed_key(3)
    results = []
    for algorithm in (agnostic_fedavg(domains=(0,) * N), fedavg()):
        hyper = algorithm.hyper({"client_lr": LR})
        state = base.start(algorithm, base.LOGREG, hyper, key)
        new, _, _ = base.train_cohort(
            base.make_round(algorithm), state, jnp.asarray(ids, jnp.int32),
            base.make_tasks(0, ids, limits, weights, key), hyper, base.device_split(store),
        )  # fmt: skip
        results.append(algorithm.global_params(new.server_state))
    base.tree_close(*results, rtol=1e-6, atol=1e-7)


def test_config_sets_domains_and_the_rule():
    overrides = ["algorithm.name='agnostic_fedavg'", "algorithm.domain_update='eg'",
                 f"algorithm.domains={[k % 2 for k in range(100)]}"]  # fmt: skip
    algorithm = build(load(None, overrides)).algorithm
    assert algorithm.name == "agnostic_fedavg" and algorithm.hook(CohortProbe) is not None
    with pytest.raises(ConfigError, match="domain_update"):
        build(load(None, [*overrides[:1], "algorithm.domain_update='sgd'"]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: agnostic_fedavg(domains=(0, 2)),
        lambda: agnostic_fedavg(domains=(0, -1)),
        lambda: agnostic_fedavg(domain_update="mirror"),
        lambda: agnostic_fedavg(domain_lr=-1.0),
        lambda: agnostic_fedavg(domains=(0, 1)).server_init({"w": jnp.zeros(2)},
                                                            {"domain_lr": jnp.float32(0)}, 3),
    ],
)  # fmt: skip
def test_impossible_settings_are_one_line_errors(make):
    with pytest.raises(ValueError) as error:
        make()
    assert "\n" not in str(error.value)


def test_hyperparameter_is_traced():
    check_traced(agnostic_fedavg(), "domain_lr", (0.1, 2.0))
