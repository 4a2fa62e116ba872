"""Tests of the partitioners: exact cover, sizes, determinism, skew direction, guards, registry."""

import numpy as np
import pytest

from fedjax_het.data import partitioners

NUM_CLASSES = 10
LABELS = np.random.default_rng(0).integers(NUM_CLASSES, size=5000)
WRITERS = np.random.default_rng(1).integers(20, size=5000)

# Every registered kind with parameters that give a full, exact split of LABELS over 20 clients.
KIND_PARAMS = {
    "iid": {},
    "dirichlet": {"beta": 0.5},
    "dirichlet_client": {"beta": 0.5},
    "classes_per_client": {"c": 2},
    "shards": {"shards_per_client": 2},
    "quantity_lognormal": {"sigma": 0.5},
    "quantity_dirichlet": {"beta": 0.5},
    "natural": {"client_ids": WRITERS},
}


def assert_exact_cover(parts: list[np.ndarray], num_examples: int) -> None:
    for part in parts:
        assert part.dtype == np.int64
    assigned = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(assigned), np.arange(num_examples))


def assert_same_split(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for part_a, part_b in zip(a, b):
        np.testing.assert_array_equal(part_a, part_b)


def differ(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return not all(np.array_equal(part_a, part_b) for part_a, part_b in zip(a, b))


def mean_js_distance_to_global(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean Jensen-Shannon divergence (nats) of each client's label distribution to the pooled one."""
    counts = partitioners.label_histogram(parts, labels, NUM_CLASSES).astype(np.float64)
    client = counts / counts.sum(axis=1, keepdims=True)
    pooled = np.broadcast_to(counts.sum(axis=0) / counts.sum(), client.shape)
    middle = (client + pooled) / 2

    def kl_to_middle(p: np.ndarray) -> np.ndarray:
        ratio = np.divide(p, middle, out=np.ones_like(p), where=p > 0)
        return (p * np.log(ratio)).sum(axis=1)

    return float(np.mean((kl_to_middle(client) + kl_to_middle(pooled)) / 2))


def classes_held(parts: list[np.ndarray], labels: np.ndarray) -> np.ndarray:
    return np.array([np.unique(labels[part]).size for part in parts])


# --- every registered kind -------------------------------------------------------------------


def test_registry_holds_the_documented_kinds():
    assert set(partitioners.PARTITIONERS) == set(KIND_PARAMS)


@pytest.mark.parametrize("kind", sorted(KIND_PARAMS))
def test_every_kind_covers_every_example_once(kind):
    parts = partitioners.partition(kind, LABELS, 20, seed=0, **KIND_PARAMS[kind])
    assert len(parts) == 20
    assert_exact_cover(parts, LABELS.size)


@pytest.mark.parametrize("kind", sorted(KIND_PARAMS))
def test_every_kind_is_deterministic_in_seed(kind):
    split = partitioners.partition(kind, LABELS, 20, seed=1, **KIND_PARAMS[kind])
    assert_same_split(split, partitioners.partition(kind, LABELS, 20, seed=1, **KIND_PARAMS[kind]))
    assert differ(split, partitioners.partition(kind, LABELS, 20, seed=2, **KIND_PARAMS[kind]))


@pytest.mark.parametrize("kind", sorted(KIND_PARAMS))
def test_every_kind_shuffles_indices_within_a_client(kind):
    client = partitioners.partition(kind, LABELS, 20, seed=0, **KIND_PARAMS[kind])[0]
    assert not np.all(np.diff(client) > 0)


@pytest.mark.parametrize("kind", sorted(set(KIND_PARAMS) - {"natural"}))
def test_every_kind_rejects_more_clients_than_examples(kind):
    with pytest.raises(ValueError, match="num_clients|examples"):
        partitioners.partition(kind, LABELS[:30], 31, seed=0, **KIND_PARAMS[kind])


# --- partition(): names and values checked ---------------------------------------------------


def test_partition_equals_the_direct_call():
    table = {"kind": "dirichlet", "beta": 0.3, "min_size": 5}
    params = dict(table)
    kind = params.pop("kind")
    assert_same_split(
        partitioners.partition(kind, LABELS, 20, seed=3, **params),
        partitioners.dirichlet_label_skew(LABELS, 20, 0.3, seed=3, min_size=5),
    )


def test_partition_rejects_an_unknown_kind_listing_the_choices():
    with pytest.raises(ValueError, match="unknown partition kind 'dirichelt'") as error:
        partitioners.partition("dirichelt", LABELS, 10, seed=0)
    message = str(error.value)
    assert "did you mean 'dirichlet'" in message
    for kind in KIND_PARAMS:
        assert kind in message


def test_partition_rejects_an_unknown_parameter_naming_it_and_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown parameter 'alpha'") as error:
        partitioners.partition("dirichlet", LABELS, 10, seed=0, alpha=0.5)
    assert "allowed: beta, min_size, max_tries" in str(error.value)


def test_partition_rejects_a_missing_required_parameter():
    with pytest.raises(ValueError, match="client_ids"):
        partitioners.partition("natural", LABELS, 10, seed=0)


@pytest.mark.parametrize(
    ("kind", "params", "match"),
    [
        ("dirichlet", {"beta": 0.0}, "beta must be > 0"),
        ("dirichlet_client", {"beta": -1.0}, "beta must be > 0"),
        ("quantity_dirichlet", {"beta": float("nan")}, "beta must be > 0"),
        ("classes_per_client", {"c": 11}, r"c \(classes per client; the labels hold 10 classes\)"),
        ("classes_per_client", {"c": 0}, r"c \(classes per client"),
        ("shards", {"shards_per_client": 0}, "shards_per_client"),
        ("quantity_lognormal", {"sigma": -0.1}, "sigma"),
        ("iid", {"sizes": np.full(10, 600)}, "sizes"),
        ("dirichlet", {"min_size": 600}, "min_size"),
    ],
)
def test_partition_rejects_bad_values_with_a_clear_message(kind, params, match):
    with pytest.raises(ValueError, match=match):
        partitioners.partition(kind, LABELS, 10, seed=0, **params)


# --- iid and quantity skew -------------------------------------------------------------------


def test_iid_covers_every_example_once_in_equal_sizes():
    parts = partitioners.iid(1003, 10, seed=0)
    assert_exact_cover(parts, 1003)
    assert {part.size for part in parts} == {100, 101}


def test_iid_counts_labels_or_takes_their_number():
    assert_same_split(partitioners.iid(LABELS, 7, seed=3), partitioners.iid(LABELS.size, 7, seed=3))


def test_iid_takes_given_sizes_and_leaves_the_rest_out():
    sizes = np.array([5, 0, 30, 65])
    parts = partitioners.iid(200, 4, seed=0, sizes=sizes)
    assert [part.size for part in parts] == sizes.tolist()
    assigned = np.concatenate(parts)
    assert np.unique(assigned).size == 100 and assigned.max() < 200


def test_iid_rejects_no_clients():
    with pytest.raises(ValueError, match="num_clients"):
        partitioners.iid(10, 0, seed=0)


def coefficient_of_variation(sizes: np.ndarray) -> float:
    return float(np.std(sizes) / np.mean(sizes))


@pytest.mark.parametrize(
    ("rule", "level"), [(partitioners.lognormal_sizes, 0.5), (partitioners.dirichlet_sizes, 3.0)]
)
def test_size_rules_sum_to_the_examples_and_meet_min_size(rule, level):
    sizes = rule(5000, 50, level, seed=0, min_size=20)
    assert sizes.dtype == np.int64 and sizes.shape == (50,)
    assert sizes.sum() == 5000 and sizes.min() >= 20


def test_lognormal_spread_matches_the_closed_form():
    # Normalising does not change the coefficient of variation; for LogNormal(0, s^2) it is
    # sqrt(exp(s^2) - 1). With 2000 clients the sample value is within a few percent of it.
    sizes = partitioners.lognormal_sizes(10**7, 2000, 0.5, seed=0)
    assert coefficient_of_variation(sizes) == pytest.approx(np.sqrt(np.exp(0.25) - 1), rel=0.1)


def test_dirichlet_sizes_spread_matches_the_closed_form():
    # For q ~ Dir_K(beta), Var(q_k) = (K - 1) / (K^2 (K beta + 1)), so CV^2 = (K - 1) / (K beta + 1).
    k, beta = 2000, 2.0
    sizes = partitioners.dirichlet_sizes(10**7, k, beta, seed=0, min_size=0)
    expected = np.sqrt((k - 1) / (k * beta + 1))
    assert coefficient_of_variation(sizes) == pytest.approx(expected, rel=0.1)


def test_more_sigma_or_less_beta_gives_more_quantity_skew():
    lognormal = [
        coefficient_of_variation(partitioners.lognormal_sizes(5000, 100, s, seed=0))
        for s in (0.0, 0.3, 1.0)
    ]
    dirichlet = [
        coefficient_of_variation(partitioners.dirichlet_sizes(5000, 100, b, seed=0, min_size=0))
        for b in (0.3, 3.0, float("inf"))
    ]
    assert lognormal[0] < 0.01 < lognormal[1] < lognormal[2]
    assert dirichlet[0] > dirichlet[1] > 0.01 > dirichlet[2]


@pytest.mark.parametrize(
    ("partitioner", "rule"),
    [
        (partitioners.quantity_lognormal, partitioners.lognormal_sizes),
        (partitioners.quantity_dirichlet, partitioners.dirichlet_sizes),
    ],
)
def test_quantity_partitioners_use_their_size_rule_on_iid_content(partitioner, rule):
    parts = partitioner(LABELS, 10, 1.0, seed=4, min_size=50)
    sizes = rule(LABELS.size, 10, 1.0, seed=4, min_size=50)
    assert [part.size for part in parts] == sizes.tolist()
    assert mean_js_distance_to_global(parts, LABELS) < 0.02


def test_quantity_dirichlet_min_size_guard_redraws():
    unguarded = partitioners.quantity_dirichlet(LABELS, 10, 0.5, seed=0, min_size=0)
    guarded = partitioners.quantity_dirichlet(LABELS, 10, 0.5, seed=0, min_size=100)
    assert min(part.size for part in unguarded) < 100
    assert min(part.size for part in guarded) >= 100


def test_quantity_dirichlet_raises_naming_min_size_when_it_cannot_be_met():
    with pytest.raises(ValueError, match="min_size=90") as error:
        partitioners.quantity_dirichlet(LABELS, 50, 0.01, seed=0, min_size=90, max_tries=3)
    assert "50 clients" in str(error.value)


# --- label skew: Dirichlet per class over clients (NIID-Bench) -------------------------------


def test_smaller_beta_gives_more_label_skew():
    distances = [
        mean_js_distance_to_global(
            partitioners.dirichlet_label_skew(LABELS, 20, beta, seed=0), LABELS
        )
        for beta in (0.1, 1.0, 100.0)
    ]
    assert distances[0] > distances[1] > distances[2]
    assert distances[2] < 0.01


def test_infinite_beta_gives_every_client_an_equal_share_of_every_class():
    parts = partitioners.dirichlet_label_skew(LABELS, 10, float("inf"), seed=0)
    counts = partitioners.label_histogram(parts, LABELS, NUM_CLASSES)
    class_totals = np.bincount(LABELS, minlength=NUM_CLASSES)
    assert np.all(np.abs(counts - class_totals / 10) <= 1)


def test_dirichlet_min_size_guard_redraws_until_every_client_is_large_enough():
    unguarded = partitioners.dirichlet_label_skew(LABELS, 20, 0.1, seed=0, min_size=0)
    guarded = partitioners.dirichlet_label_skew(LABELS, 20, 0.1, seed=0, min_size=50)
    assert min(part.size for part in unguarded) < 50
    assert min(part.size for part in guarded) >= 50


def test_dirichlet_raises_naming_min_size_when_it_cannot_be_met():
    labels = np.arange(500) % 10
    with pytest.raises(ValueError, match="min_size=10") as error:
        partitioners.dirichlet_label_skew(labels, 50, 0.001, seed=0, min_size=10, max_tries=5)
    assert "50 clients" in str(error.value)


def test_dirichlet_rejects_more_required_examples_than_exist():
    with pytest.raises(ValueError, match="min_size"):
        partitioners.dirichlet_label_skew(np.zeros(99, dtype=int), 9, 1.0, seed=0, min_size=12)


@pytest.mark.parametrize(
    ("labels", "num_clients", "beta", "argument"),
    [
        (LABELS, 10, 0.0, "beta"),
        (LABELS, 10, -1.0, "beta"),
        (LABELS, 10, float("nan"), "beta"),
        (LABELS, 0, 1.0, "num_clients"),
        (LABELS, 2.5, 1.0, "num_clients"),
        (LABELS.reshape(50, 100), 10, 1.0, "labels"),
        (LABELS.astype(np.float32), 10, 1.0, "labels"),
        (LABELS - 1, 10, 1.0, "labels"),
    ],
)
def test_dirichlet_rejects_invalid_arguments(labels, num_clients, beta, argument):
    with pytest.raises(ValueError, match=argument):
        partitioners.dirichlet_label_skew(labels, num_clients, beta, seed=0)


# --- label skew: Dirichlet per client over classes (Hsu et al. 2019) -------------------------


def test_dirichlet_client_gives_equal_sizes_or_the_given_ones():
    parts = partitioners.dirichlet_client_skew(LABELS, 30, 0.5, seed=0)
    assert {part.size for part in parts} <= {166, 167}
    sizes = partitioners.lognormal_sizes(LABELS.size, 30, 1.0, seed=0)
    parts = partitioners.dirichlet_client_skew(LABELS, 30, 0.5, seed=0, sizes=sizes)
    assert [part.size for part in parts] == sizes.tolist()
    assert_exact_cover(parts, LABELS.size)


def test_dirichlet_client_smaller_beta_gives_more_label_skew():
    distances = [
        mean_js_distance_to_global(
            partitioners.dirichlet_client_skew(LABELS, 20, beta, seed=0), LABELS
        )
        for beta in (0.05, 1.0, float("inf"))
    ]
    assert distances[0] > distances[1] > distances[2]
    assert distances[2] < 0.01


def test_dirichlet_client_label_fractions_follow_dir_beta_times_prior():
    # Client label fractions f = Multinomial(n, q) / n with q ~ Dir(beta p) have mean p and
    # Var(f_c) = p_c (1 - p_c) (1 + beta / n) / (beta + 1). A pool 3x the total drawn keeps the
    # finite-pool correction out of play.
    prior, beta, n, clients = np.array([0.5, 0.3, 0.2]), 1.0, 50, 400
    labels = np.repeat(np.arange(3), (prior * 3 * n * clients).astype(int))
    sizes = np.full(clients, n)
    parts = partitioners.dirichlet_client_skew(labels, clients, beta, seed=0, sizes=sizes)
    fractions = np.array([np.bincount(labels[part], minlength=3) / n for part in parts])
    variance = prior * (1 - prior) * (1 + beta / n) / (beta + 1)
    assert np.all(np.abs(fractions.mean(axis=0) - prior) < 5 * np.sqrt(variance / clients))
    np.testing.assert_allclose(fractions.var(axis=0), variance, rtol=0.25)


# --- label skew: exactly c classes per client (NIID-Bench #C=k) ------------------------------


@pytest.mark.parametrize("c", [1, 2, 3, 10])
def test_classes_per_client_gives_exactly_c_classes(c):
    parts = partitioners.classes_per_client(LABELS, 20, c, seed=0)
    np.testing.assert_array_equal(classes_held(parts, LABELS), np.full(20, c))
    assert_exact_cover(parts, LABELS.size)


def test_classes_per_client_gives_client_k_class_k_mod_c_and_equal_shares_per_class():
    parts = partitioners.classes_per_client(LABELS, 25, 3, seed=0)
    counts = partitioners.label_histogram(parts, LABELS, NUM_CLASSES)
    assert all(counts[k, k % NUM_CLASSES] > 0 for k in range(25))
    for c in range(NUM_CLASSES):
        owned = counts[:, c][counts[:, c] > 0]
        assert owned.sum() == np.count_nonzero(LABELS == c)
        assert owned.max() - owned.min() <= 1


def test_classes_per_client_leaves_out_only_classes_nobody_owns():
    parts = partitioners.classes_per_client(LABELS, 3, 2, seed=0)
    assigned = np.concatenate(parts)
    assert np.unique(assigned).size == assigned.size
    owned = np.unique(LABELS[assigned])
    np.testing.assert_array_equal(np.sort(assigned), np.flatnonzero(np.isin(LABELS, owned)))
    assert owned.size < NUM_CLASSES


def test_more_classes_per_client_gives_less_label_skew():
    distances = [
        mean_js_distance_to_global(partitioners.classes_per_client(LABELS, 20, c, seed=0), LABELS)
        for c in (1, 2, 5, 10)
    ]
    assert distances[0] > distances[1] > distances[2] > distances[3]


def test_classes_per_client_rejects_a_class_smaller_than_its_owners():
    labels = np.concatenate([np.zeros(100, dtype=int), np.ones(3, dtype=int)])
    with pytest.raises(ValueError, match="class 1 has 3 examples but"):
        partitioners.classes_per_client(labels, 10, 2, seed=0)


# --- label skew: shards (McMahan et al. 2017) ------------------------------------------------


def test_shards_give_every_client_s_shards_of_equal_size_when_they_divide():
    labels = np.repeat(np.arange(NUM_CLASSES), 100)  # 50 shards of 20: no shard spans 2 classes
    parts = partitioners.shards(labels, 25, 2, seed=0)
    assert_exact_cover(parts, labels.size)
    assert {part.size for part in parts} == {40}
    counts = partitioners.label_histogram(parts, labels, NUM_CLASSES)
    assert np.all(counts % 20 == 0)
    assert np.all((counts > 0).sum(axis=1) <= 2)


def test_shards_differ_by_at_most_one_when_they_do_not_divide():
    parts = partitioners.shards(LABELS[:1003], 10, 3, seed=0)  # 30 shards of 33 or 34
    assert_exact_cover(parts, 1003)
    assert all(3 * 33 <= part.size <= 3 * 34 for part in parts)
    assert np.all(classes_held(parts, LABELS[:1003]) <= 6)


def test_more_shards_per_client_gives_less_label_skew():
    distances = [
        mean_js_distance_to_global(partitioners.shards(LABELS, 20, s, seed=0), LABELS)
        for s in (1, 2, 10)
    ]
    assert distances[0] > distances[1] > distances[2]


# --- natural ids -----------------------------------------------------------------------------


def test_natural_makes_one_client_per_id_in_id_order():
    parts = partitioners.natural(LABELS, 20, seed=0, client_ids=WRITERS)
    for k, part in enumerate(parts):
        np.testing.assert_array_equal(np.sort(part), np.flatnonzero(WRITERS == k))


def test_natural_takes_string_ids():
    ids = np.array([f"w{w:02d}" for w in WRITERS])
    parts = partitioners.natural(LABELS, 20, seed=0, client_ids=ids)
    assert [np.unique(ids[part]).tolist() for part in parts] == [[f"w{k:02d}"] for k in range(20)]


def test_natural_samples_ids_and_leaves_the_others_out():
    parts = partitioners.natural(LABELS, 5, seed=0, client_ids=WRITERS)
    chosen = [int(np.unique(WRITERS[part])[0]) for part in parts]
    assert chosen == sorted(chosen) and len(set(chosen)) == 5
    np.testing.assert_array_equal(
        np.sort(np.concatenate(parts)), np.flatnonzero(np.isin(WRITERS, chosen))
    )
    other = partitioners.natural(LABELS, 5, seed=1, client_ids=WRITERS)
    assert chosen != [int(WRITERS[part[0]]) for part in other]


def test_natural_drops_ids_below_min_size():
    ids = np.concatenate([np.zeros(10, dtype=int), np.ones(3, dtype=int), np.full(10, 2)])
    parts = partitioners.natural(ids.size, 2, seed=0, client_ids=ids, min_size=5)
    assert [np.unique(ids[part]).tolist() for part in parts] == [[0], [2]]
    with pytest.raises(ValueError, match="exceeds the 2 ids holding at least min_size=5"):
        partitioners.natural(ids.size, 3, seed=0, client_ids=ids, min_size=5)


def test_natural_rejects_ids_of_the_wrong_shape():
    with pytest.raises(ValueError, match="client_ids must have shape"):
        partitioners.natural(LABELS, 5, seed=0, client_ids=WRITERS[:10])


# --- per-client test splits ------------------------------------------------------------------


def test_holdout_splits_each_clients_examples_by_the_fraction():
    parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.5, seed=0)
    train, test = partitioners.holdout(parts, 0.25, seed=0)
    for part, train_part, test_part in zip(parts, train, test):
        assert test_part.size == round(0.25 * part.size)
        np.testing.assert_array_equal(
            np.sort(np.concatenate([train_part, test_part])), np.sort(part)
        )
        assert np.intersect1d(train_part, test_part).size == 0
    _, other = partitioners.holdout(parts, 0.25, seed=1)
    assert differ(test, other)


def test_holdout_draws_each_example_with_the_fraction():
    # Over many seeds every example of a client is held out with probability ~ fraction.
    part = [np.arange(40)]
    held = np.zeros(40)
    for seed in range(500):
        held[partitioners.holdout(part, 0.25, seed=seed)[1][0]] += 1
    tolerance = 5 * np.sqrt(500 * 0.25 * 0.75)
    assert np.all(np.abs(held - 500 * 0.25) < tolerance)


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan")])
def test_holdout_rejects_a_fraction_outside_0_1(fraction):
    with pytest.raises(ValueError, match=r"test_fraction must lie in \[0, 1\]"):
        partitioners.holdout([np.arange(10)], fraction, seed=0)


def test_split_like_covers_every_test_example_once():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.3, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=2000)
    test_parts = partitioners.split_like(train_parts, LABELS, test_labels, seed=0)
    assert len(test_parts) == 20
    assert_exact_cover(test_parts, test_labels.size)


def test_split_like_is_deterministic_in_seed():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.3, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=2000)
    split = partitioners.split_like(train_parts, LABELS, test_labels, seed=5)
    assert_same_split(split, partitioners.split_like(train_parts, LABELS, test_labels, seed=5))
    other = partitioners.split_like(train_parts, LABELS, test_labels, seed=6)
    assert differ(split, other)


def test_split_like_gives_no_test_examples_of_classes_a_client_never_trained_on():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.1, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=2000)
    test_parts = partitioners.split_like(train_parts, LABELS, test_labels, seed=0)
    train_counts = partitioners.label_histogram(train_parts, LABELS, NUM_CLASSES)
    test_counts = partitioners.label_histogram(test_parts, test_labels, NUM_CLASSES)
    assert np.any(train_counts == 0)
    assert np.all(test_counts[train_counts == 0] == 0)


def test_split_like_test_labels_follow_each_clients_train_labels():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 10, 0.3, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=5000)
    test_parts = partitioners.split_like(train_parts, LABELS, test_labels, seed=0)
    train_counts = partitioners.label_histogram(train_parts, LABELS, NUM_CLASSES)
    test_counts = partitioners.label_histogram(test_parts, test_labels, NUM_CLASSES)
    for train_row, test_row in zip(train_counts, test_counts):
        assert np.corrcoef(train_row, test_row)[0, 1] > 0.9


def test_split_like_spreads_classes_nobody_trained_on_over_all_clients():
    train_labels = np.repeat([0, 1], 50)
    train_parts = [np.arange(0, 50), np.arange(50, 100)]
    test_labels = np.full(400, 2)
    test_parts = partitioners.split_like(train_parts, train_labels, test_labels, seed=0)
    assert_exact_cover(test_parts, 400)
    assert all(part.size > 150 for part in test_parts)


def test_split_like_rejects_a_training_split_that_repeats_an_example():
    with pytest.raises(ValueError, match="client_train_indices assigns some example"):
        partitioners.split_like([np.arange(5), np.arange(4, 8)], LABELS, LABELS[:10], seed=0)


def test_label_histogram_counts_each_clients_labels():
    labels = np.array([0, 1, 1, 2, 2, 2])
    counts = partitioners.label_histogram([np.array([0, 3]), np.array([1, 2, 4, 5])], labels, 4)
    np.testing.assert_array_equal(counts, [[1, 0, 1, 0], [0, 2, 2, 0]])


def test_label_histogram_rejects_labels_beyond_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        partitioners.label_histogram([np.array([0])], np.array([0, 5]), 3)
