"""APFL against a float64 per-client sequential reference and FedJAX's toy values.

The reference (``cohort_reference.check_rounds``) keeps every client's ``(v_i, α_i)`` and
whether it has counted yet: client ``i`` starts ``w`` from ``x`` (and ``v_i`` from ``x`` in its
first counted round), and on each batch, from the values before the step, sets
``w <- w - 0.1 ∇f(w)``, ``v <- v - 0.1 α ∇f(v̄)`` and ``α <- clip(α - η_α <v - w, ∇f(v̄)>, 0, 1)``
with ``v̄ = α v + (1 - α) w``; the server moves ``x`` by 0.7 times the mean of ``x - w_i``.
Runs with ``α`` learned (from 0.3 at ``η_α = 2``, so that it moves and the clip is reached)
and fixed (``η_α = 0``). float32 engine: rtol 1e-5, atol 1e-6; float64 engine: rtol 1e-12,
atol 1e-13. The personalised models are checked against ``α v + (1 - α) x``.

FedJAX's ``apfl_test.test_create_train_for_each_client`` (one batch ``[2, 4, 6]`` whose
gradient is ``w / 12``, ``w = 4``, rates 1) is reproduced for every client's update and ``α``
and for ``v`` where ``α = 1``; for ``α`` in ``{0, 0.5}`` FedJAX's ``v`` leaves out the chain
rule's ``α`` (it steps along ``∇f(v̄)``), so ``v`` is checked against the paper's step
instead. Its ``apply`` toy fills a short last batch by repeating an example, which changes
that toy's gradient (a sum over the batch), where the engine masks: not reproduced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scaffold_feddyn as base
from cohort_reference import (
    Reference,
    batches,
    check_rounds,
    check_traced,
    cross_entropy,
    toy_store,
    weighted_mean,
)

from fedjax_het import rng
from fedjax_het.algorithms.apfl import APFLState, apfl
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.engine import local
from fedjax_het.engine.hooks import Personalized
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.models import Model
from fedjax_het.sampling import uniform
from fedjax_het.system.sampler import Sampler
from fedjax_het.training.options import run_options
from fedjax_het.training.simulate import run

LR, SERVER_LR, ALPHA = base.CLIENT_LR, base.SERVER_LR, 0.3
ALGORITHM = apfl(alpha=ALPHA, client_lr=LR, server_lr=SERVER_LR)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def inner(a, b) -> float:
    return float(sum(np.sum(u * v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


def mix(alpha: float, v, w):
    """``α v + (1 - α) w``."""
    return jax.tree.map(lambda a, b: alpha * a + (1 - alpha) * b, v, w)


def scaled_step(params, lr: float, grads):
    """``params - lr grads``."""
    return jax.tree.map(lambda a, g: a - lr * g, params, grads)


def apfl_reference(alpha_lr: float) -> Reference:
    """APFL in numpy (module docstring); client states are ``APFLState(v, α, started)``."""

    def client(k, data, server, state):
        x = server["x"]
        w, v, alpha = x, (state.v if state.started else x), float(state.alpha)
        loss_sum = 0.0
        for batch in batches(data):
            g_w, loss = cross_entropy(w, *batch)
            g_mixed, _ = cross_entropy(mix(alpha, v, w), *batch)
            step_alpha = alpha_lr * inner(base.tree_sub(v, w), g_mixed)
            w, v, alpha = (
                scaled_step(w, LR, g_w),
                scaled_step(v, LR * alpha, g_mixed),
                min(max(alpha - step_alpha, 0.0), 1.0),
            )
            loss_sum += loss
        return w, APFLState(v, np.asarray(alpha), np.asarray(True)), loss_sum

    def after(server, clients):
        x = server["x"]
        mean = weighted_mean([(base.tree_sub(x, w), n) for _, w, _, n in clients])
        if mean is None:
            return server
        return {**server, "x": scaled_step(x, SERVER_LR, mean)}

    def first_state(x):
        return APFLState(x, np.asarray(ALPHA), np.asarray(False))

    return Reference(lambda x: {}, first_state, client, after)


def check_apfl(alpha_lr: float, precision: str = "float32", *tolerance: float):
    """``check_rounds`` for APFL at ``tolerance`` (rtol, atol; default the harness's); also
    checks every client's personalised model."""
    tolerance = tolerance or (base.RTOL, base.ATOL)
    server, state = check_rounds(
        ALGORITHM, {"apfl_alpha_lr": alpha_lr}, rng.seed_key(13), apfl_reference(alpha_lr),
        precision=precision, rtol=tolerance[0], atol=tolerance[1],
    )  # fmt: skip
    states = jax.device_get(state.client_states)
    for k in range(base.N):
        own = jax.tree.map(lambda s, k=k: s[k], states)
        alpha, v = float(own.alpha), base.as64(own.v)
        want = mix(alpha, v, server["x"]) if bool(own.started) else server["x"]
        got = ALGORITHM.hook(Personalized).params(state.server_state, own)
        base.tree_close(got, want, *tolerance)
    return states


@pytest.mark.parametrize("alpha_lr", [2.0, 0.0])
def test_matches_the_sequential_reference(alpha_lr):
    """Four rounds: x, every (v_i, α_i), the training loss and the personalised models."""
    states = check_apfl(alpha_lr)
    alphas = np.asarray(states.alpha)
    assert np.all(alphas == ALPHA) if alpha_lr == 0 else np.ptp(alphas) > 0.05


@pytest.mark.parametrize("alpha_lr", [2.0, 0.0])
def test_float64_engine_matches_the_reference_to_1e_12(x64, alpha_lr):
    check_apfl(alpha_lr, "float64", 1e-12, 1e-13)


def quadratic_toy() -> Model:
    """A model whose mean loss on the batch ``[2, 4, 6]`` is ``w² / 24``: gradient ``w / 12``,
    FedJAX's ``grad_fn`` on that batch."""
    return Model(
        init=lambda key: {"w": jnp.float32(4.0)},
        apply=lambda params, x, *, train, key: jnp.broadcast_to(params["w"] ** 2 / 24, x.shape[:1]),
        per_example_loss=lambda outputs, y: outputs,
        name="quadratic_toy",
    )


def test_fedjax_create_train_for_each_client():
    """Six clients, one batch each, from w = 4 with (v, α) in {2, 8} x {0, 0.5, 1}."""
    model, algorithm, n = quadratic_toy(), apfl(), 6
    store = toy_store(*[[2.0, 4.0, 6.0]] * n)
    work = LocalWork(batch_size=3, epochs=1)
    ids = jnp.arange(n, dtype=jnp.int32)
    sampler = Sampler(select=lambda k, r: ids, num_clients=n, cohort_size=n)
    spec = local.LocalSpec(model, algorithm, work, 1, 3)
    round_ = Round(model, algorithm, sampler, spec, chunk=4)
    hyper = algorithm.hyper({"client_lr": 1.0, "apfl_alpha_lr": 1.0, "server_lr": 1.0})
    key = jax.random.key(0)
    state = init_state(model, algorithm, n, hyper, key)
    own = APFLState(
        {"w": jnp.array([2.0, 2.0, 2.0, 8.0, 8.0, 8.0])},
        jnp.array([0.0, 0.5, 1.0, 0.0, 0.5, 1.0]),
        jnp.ones(n, bool),
    )
    state = state.replace(client_states=own)
    state, _ = jax.jit(lambda s: round_.step(s, jnp.int32(0), hyper, device_split(store), key))(
        state
    )
    new = jax.device_get(state.client_states)
    np.testing.assert_allclose(new.alpha, [2 / 3, 1, 1, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(new.v["w"][[2, 5]], [1.8333334, 7.3333335], rtol=1e-6)  # FedJAX's
    paper = [2.0, 2 - 0.5 * 3 / 12, 2 - 2 / 12, 8.0, 8 - 0.5 * 6 / 12, 8 - 8 / 12]
    np.testing.assert_allclose(new.v["w"], paper, rtol=1e-6)
    np.testing.assert_allclose(state.server_state.params["w"], 4 - 0.33333325, rtol=1e-6)


def test_alpha_outside_the_unit_interval_is_a_one_line_error():
    for make in (lambda: apfl(alpha=1.5), lambda: apfl().hyper({"apfl_alpha_lr": -1.0})):
        with pytest.raises(ValueError) as error:
            make()
        assert "\n" not in str(error.value)


def test_hyperparameter_is_traced():
    check_traced(ALGORITHM, "apfl_alpha_lr", (0.0, 2.0))


def test_a_run_reports_each_clients_personalised_accuracy():
    """simulate.run on tiny Synthetic data: personal accuracy is each client's
    ``α v + (1 - α) w`` (the global model before its first round) on its own test split."""
    c = leaf_synthetic(6, alpha=0.5, beta=0.5, seed=0, num_features=base.F, num_classes=base.C,
                       size_mean=2.0)  # fmt: skip
    data = FederatedData.from_client_arrays(
        c.train_x, c.train_y, test_xs=c.test_x, test_ys=c.test_y, num_classes=base.C
    )
    history = run(
        data,
        *run_options(
            model=base.LOGREG,
            algorithm=apfl(alpha_lr=0.5),
            sampler=uniform(6, 3),
            rounds=3,
            eval_every=3,
            work=LocalWork(batch_size=8, epochs=1),
            progress=False,
        ),
    )  # fmt: skip
    assert history.personal_accuracy.shape == (6,)
    states = history.state.client_states
    for k in range(6):
        own = jax.tree.map(lambda s, k=k: s[k], states)
        params = base.as64(apfl().hook(Personalized).params(history.state.server_state, own))
        x, y = data.test.client(k)
        logits = x.astype(np.float64) @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
        accuracy = np.mean(np.argmax(logits, axis=1) == y)
        np.testing.assert_allclose(history.personal_accuracy[k], accuracy, atol=1e-6)
    assert np.isfinite(history.summary["personal_accuracy_mean"])
