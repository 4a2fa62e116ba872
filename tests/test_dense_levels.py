"""Width levels as dense programs (engine/groups.py, algorithms/width_fedavg.py).

HeteroFL's and FedRolex's clients of one width train the cut model (``Model.at_width``) on
their kept units instead of masks on the full one. The float64 per-client reference of
``test_submodels`` covers the MLP (its ``-dense`` cases); here: the same round with masks and
dense for the CNN's channel-last flattening and the LSTM's recurrent kernels, the sums' bits
for every vmapped chunk, ragged and idle slots, and where the engine keeps masks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from fedjax_het import models, rng
from fedjax_het.algorithms.fedrolex import fedrolex
from fedjax_het.algorithms.fjord import fjord
from fedjax_het.algorithms.heterofl import heterofl
from fedjax_het.algorithms.width_fedavg import dense_client, width_fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import local
from fedjax_het.engine import round as round_lib
from fedjax_het.engine.groups import grouped_chunk
from fedjax_het.system.sampler import Sampler

WIDTHS = (1.0, 0.5, 0.25)
NUM_CLIENTS = 12
WORK = LocalWork(batch_size=4, epochs=1.0)
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def federated(shape, num_classes, integer=False) -> FederatedData:
    """12 clients of 3 to 14 examples (ragged)."""
    rs = np.random.RandomState(0)
    sizes = [3 + (5 * k) % 12 for k in range(NUM_CLIENTS)]
    if integer:
        xs = [rs.randint(0, num_classes, (n, *shape)).astype(np.int32) for n in sizes]
    else:
        xs = [rs.normal(size=(n, *shape)).astype(np.float32) for n in sizes]
    ys = [rs.randint(0, num_classes, n).astype(np.int32) for n in sizes]
    return FederatedData.from_client_arrays(xs, ys, test_xs=xs, test_ys=ys,
                                            num_classes=num_classes)


MLP_DATA = federated((6,), 3)
MLP = models.mlp((6,), 3, hidden=(10, 7))


def make_round(algorithm, model, data, cohort, chunk, mesh=None) -> round_lib.Round:
    ids = jnp.asarray(cohort, jnp.int32)
    sampler = Sampler(select=lambda key, r: ids, num_clients=NUM_CLIENTS, cohort_size=len(cohort))
    max_count = int(data.train.count.max())
    spec = local.LocalSpec(model, algorithm, WORK, WORK.static_steps(max_count), max_count)
    return round_lib.Round(model, algorithm, sampler, spec, chunk=chunk, mesh=mesh)


def run(algorithm, model=MLP, data=MLP_DATA, cohort=(3, 0, 7, 11, 5, 2, 9, 4), chunk=2,
        rounds=2, weights=None):
    """The global params after ``rounds`` rounds, and the last round's stats."""
    round_ = make_round(algorithm, model, data, cohort, chunk)
    hyper, key, train = algorithm.hyper(), rng.seed_key(1), round_lib.device_split(data.train)
    state = fast_jit(round_lib.init_state, static_argnums=(0, 1, 2))(
        model, algorithm, NUM_CLIENTS, hyper, key)

    @fast_jit
    def one(state, r):
        ids, tasks = round_.cohort(r, train, key)
        if weights is not None:  # a slot at weight 0 and no steps: idle
            tasks = tasks.replace(weight=tasks.weight * weights, step_limit=jnp.where(
                weights > 0, tasks.step_limit, 0))
        state, stats, _ = round_.train_cohort(state, ids, tasks, hyper, train)
        return state, stats

    stats = None
    for r in range(rounds):
        state, stats = one(state, jnp.int32(r))
    return algorithm.global_params(state.server_state), stats


def assert_close(a, b, rtol=2e-5, atol=2e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def max_gap(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("factory", [heterofl, fedrolex])
def test_vmapped_chunks_of_any_size_give_the_same_bits(factory):
    """Chunks 2 and 4 (and 8, capped at ceil(8 / 3) = 3, run as 2) give the same bits: each
    level's sum is its own pairwise tree; chunk 1 (no vmap) within float rounding."""
    algorithm = factory(widths=WIDTHS, dense_groups=True)
    weights = jnp.asarray([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32)  # two idle slots
    two, stats = run(algorithm, chunk=2, weights=weights)
    for chunk in (4, 8):
        got, got_stats = run(algorithm, chunk=chunk, weights=weights)
        jax.tree.map(np.testing.assert_array_equal, got, two)
        np.testing.assert_array_equal(got_stats.loss_sum, stats.loss_sum)
    assert_close(run(algorithm, chunk=1, weights=weights)[0], two)
    start = run(algorithm, rounds=0)[0]
    assert max_gap(two, start) > 1e-3  # the rounds did train


@pytest.mark.parametrize("factory", [heterofl, fedrolex])
@pytest.mark.parametrize("model, data", [
    (models.femnist_cnn((8, 8, 1), 4), federated((8, 8, 1), 4)),
    (models.char_lstm((5,), 7, embed=4, hidden=6, layers=2), federated((5,), 7, integer=True)),
], ids=["cnn", "lstm"])
def test_dense_levels_equal_masks(factory, model, data):
    """The CNN's channel-last flattening and the LSTM's recurrent and input kernels cut as
    the masks keep them: the same two rounds, the same stats (FedRolex's window moves), to
    float32 rounding (a convolution over 16 channels and one over 32 of which 16 are zero
    sum in different orders: 3e-6 apart on weights of 0.03 after two rounds)."""
    cohort = (1, 4, 6, 8, 10)
    masked, masked_stats = run(factory(widths=WIDTHS, dense_groups=False), model, data, cohort)
    dense, dense_stats = run(factory(widths=WIDTHS, dense_groups=True), model, data, cohort)
    assert_close(dense, masked, atol=1e-5)
    np.testing.assert_array_equal(dense_stats.steps, masked_stats.steps)
    np.testing.assert_allclose(dense_stats.loss_sum, masked_stats.loss_sum, rtol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.broadcast_to(a, b.shape), b),
                 dense_stats.trained, masked_stats.trained)


def test_grouped_chunk_is_capped_by_the_levels():
    assert grouped_chunk(8, 8, 3) == 2  # ceil(8 / 3) = 3, as a power of two
    assert grouped_chunk(2, 8, 3) == 2
    assert grouped_chunk(8, 3, 3) == 1
    assert grouped_chunk(8, 9, 1) == 8


def test_where_the_engine_keeps_masks():
    dense = heterofl(widths=WIDTHS, dense_groups=True)
    cohort = (0, 1, 2)
    assert make_round(dense, MLP, MLP_DATA, cohort, 2).dense_levels(True) is not None
    assert make_round(dense, MLP, MLP_DATA, cohort, 2).dense_levels(False) is None  # stale, masks
    assert make_round(heterofl(widths=WIDTHS, dense_groups=False), MLP, MLP_DATA, cohort,
                      2).dense_levels(True) is None
    assert make_round(fjord(widths=WIDTHS), MLP, MLP_DATA, cohort, 2).dense_levels(True) is None
    uncut = models.Model(MLP.init, MLP.apply, MLP.per_example_loss, "uncut")  # no at_width
    assert make_round(dense, uncut, MLP_DATA, cohort, 2).dense_levels(True) is None
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("clients",))
    if mesh.size > 1:
        assert make_round(dense, MLP, MLP_DATA, cohort, 2, mesh).dense_levels(True) is None
    with pytest.raises(ValueError, match="dense_groups needs one width per client"):
        width_fedavg("x", WIDTHS, ordered_dropout=True, rolling=False, scaler=False,
                     dense_groups=True)


def test_a_model_whose_cut_does_not_match_its_units_is_refused():
    wrong = MLP.__class__(MLP.init, MLP.apply, MLP.per_example_loss, "wrong",
                          at_width=lambda p: models.mlp((6,), 3, hidden=(10, 7)))  # not cut
    algorithm = heterofl(widths=WIDTHS)
    round_ = make_round(algorithm, wrong, MLP_DATA, (0, 1), 2)
    state = round_lib.init_state(wrong, algorithm, NUM_CLIENTS, algorithm.hyper(), rng.seed_key(0))
    payload = algorithm.broadcast(state.server_state)
    with pytest.raises(ValueError, match=r"at_width\(0.5\) does not build the params"):
        dense_client(1, round_.spec, algorithm.hyper(), payload,
                     round_lib.device_split(MLP_DATA.train), widths=WIDTHS, rolling=False,
                     scaler=True)


def test_levels_missing_from_the_cohort():
    """Only the widest and the narrowest level train (the middle one is empty): every level's
    sum still reaches the average, as with masks."""
    levels = tuple(0 if k % 2 else 2 for k in range(NUM_CLIENTS))
    masked, _ = run(heterofl(widths=WIDTHS, client_levels=levels, dense_groups=False))
    dense, _ = run(heterofl(widths=WIDTHS, client_levels=levels, dense_groups=True))
    assert_close(dense, masked)
    narrow = run(heterofl(widths=WIDTHS, client_levels=(2,) * NUM_CLIENTS, dense_groups=True))[0]
    assert_close(narrow, run(heterofl(widths=WIDTHS, client_levels=(2,) * NUM_CLIENTS,
                                      dense_groups=False))[0])
