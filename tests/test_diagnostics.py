"""Tests of fedjax_het.data.diagnostics: Gini, JS and TV against independent loops; the report."""

import itertools
import json
import math

import numpy as np
import pytest
from scipy.spatial import distance

from fedjax_het.data import diagnostics, partitioners
from fedjax_het.data.federated import FederatedData

NUM_CLASSES = 10
LABELS = np.random.default_rng(0).integers(NUM_CLASSES, size=4000).astype(np.int32)
FEATURES = np.zeros((LABELS.size, 2), np.float32)


def federate(parts: list[np.ndarray], labels: np.ndarray = LABELS, **kwargs) -> FederatedData:
    return FederatedData.from_client_arrays(
        [FEATURES[p] for p in parts], [labels[p] for p in parts], num_classes=NUM_CLASSES, **kwargs
    )


def one_class_per_client(num_clients: int) -> list[np.ndarray]:
    """Client k holds a disjoint slice of class k mod 10."""
    stride = -(-num_clients // NUM_CLASSES)
    return [
        np.flatnonzero(LABELS == k % NUM_CLASSES)[k // NUM_CLASSES :: stride]
        for k in range(num_clients)
    ]


def gini_by_pairs(values: list[float]) -> float:
    """Mean absolute difference over all ordered pairs, divided by twice the mean."""
    k = len(values)
    total = sum(abs(a - b) for a, b in itertools.product(values, values))
    return total / (2 * k * k * (sum(values) / k))


@pytest.mark.parametrize("k", [1, 2, 5, 40])
def test_gini_of_equal_sizes_is_zero(k):
    assert diagnostics.gini(np.full(k, 7)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("k", [2, 3, 10, 100])
def test_gini_of_one_client_holding_everything_is_k_minus_one_over_k(k):
    sizes = np.zeros(k)
    sizes[k // 2] = 123
    assert diagnostics.gini(sizes) == pytest.approx((k - 1) / k, rel=1e-12)


def test_gini_matches_the_pairwise_definition():
    sizes = np.random.default_rng(1).lognormal(3, 1.5, 37).round()
    assert diagnostics.gini(sizes) == pytest.approx(gini_by_pairs(sizes.tolist()), rel=1e-12)


@pytest.mark.parametrize("bad", [np.array([]), np.array([3.0, -1.0])])
def test_gini_rejects_empty_or_negative(bad):
    with pytest.raises(ValueError, match="values"):
        diagnostics.gini(bad)


def test_js_and_tv_match_independent_definitions():
    rng = np.random.default_rng(2)
    q = rng.dirichlet(np.full(6, 0.3), size=20)
    q[:, 0] = 0.0  # zero entries must contribute 0 log 0 = 0
    q /= q.sum(axis=1, keepdims=True)
    p = rng.dirichlet(np.ones(6))
    js = diagnostics.jensen_shannon(q, p)
    tv = diagnostics.total_variation(q, p)
    for k in range(q.shape[0]):
        # scipy returns the JS distance, the square root of the divergence.
        assert js[k] == pytest.approx(distance.jensenshannon(q[k], p, base=2) ** 2, rel=1e-9)
        assert tv[k] == pytest.approx(sum(abs(a - b) for a, b in zip(q[k], p)) / 2, rel=1e-12)


def test_js_and_tv_of_disjoint_distributions_are_one():
    q, p = np.array([0.2, 0.8, 0.0, 0.0]), np.array([0.0, 0.0, 0.5, 0.5])
    assert float(diagnostics.jensen_shannon(q, p)) == pytest.approx(1.0)
    assert float(diagnostics.total_variation(q, p)) == pytest.approx(1.0)


def test_describe_sizes_and_distances_match_an_independent_loop():
    parts = partitioners.dirichlet_label_skew(LABELS, 12, 0.3, seed=0)
    summary = diagnostics.describe(federate(parts))
    sizes = [len(p) for p in parts]
    assert summary["num_clients"] == 12 and summary["num_classes"] == NUM_CLASSES
    assert summary["num_examples"] == LABELS.size
    assert summary["sizes"]["min"] == min(sizes) and summary["sizes"]["max"] == max(sizes)
    assert summary["sizes"]["median"] == pytest.approx(float(np.median(sizes)))
    assert summary["sizes"]["mean"] == pytest.approx(LABELS.size / 12)
    assert summary["sizes"]["gini"] == pytest.approx(gini_by_pairs(sizes), rel=1e-12)

    pooled = [np.count_nonzero(LABELS == c) / LABELS.size for c in range(NUM_CLASSES)]
    js, tv, held = [], [], []
    for k, part in enumerate(parts):
        own = [np.count_nonzero(LABELS[part] == c) for c in range(NUM_CLASSES)]
        assert summary["label_histogram"][k] == own
        q = [n / len(part) for n in own]
        middle = [(a + b) / 2 for a, b in zip(q, pooled)]
        kl_q = sum(a * math.log2(a / m) for a, m in zip(q, middle) if a > 0)
        kl_p = sum(b * math.log2(b / m) for b, m in zip(pooled, middle) if b > 0)
        js.append((kl_q + kl_p) / 2)
        tv.append(sum(abs(a - b) for a, b in zip(q, pooled)) / 2)
        held.append(sum(n > 0 for n in own))
    assert summary["global_label_distribution"] == pytest.approx(pooled)
    for key, values in (("js_to_global", js), ("tv_to_global", tv), ("classes_per_client", held)):
        assert summary[key]["mean"] == pytest.approx(sum(values) / len(values), rel=1e-9)
        assert summary[key]["min"] == pytest.approx(min(values), rel=1e-9)
        assert summary[key]["max"] == pytest.approx(max(values), rel=1e-9)
    assert "test_sizes" not in summary


def test_iid_split_is_near_the_global_distribution():
    summary = diagnostics.describe(federate(partitioners.iid(LABELS.size, 10, seed=0)))
    # 400 examples per client over 10 classes: sampling noise alone, far below one class per client.
    assert summary["js_to_global"]["max"] < 0.05
    assert summary["tv_to_global"]["max"] < 0.15
    assert summary["sizes"]["gini"] == pytest.approx(0.0, abs=1e-12)
    assert summary["classes_per_client"]["min"] == NUM_CLASSES


def test_one_class_per_client_split_is_far_from_the_global_distribution():
    summary = diagnostics.describe(federate(one_class_per_client(20)))
    assert summary["classes_per_client"]["max"] == 1
    # A point mass against a near-uniform distribution over 10 classes: JS about 0.76 bits, TV 0.9.
    assert summary["js_to_global"]["min"] > 0.5
    assert summary["tv_to_global"]["min"] > 0.85


def test_describe_reports_the_test_split():
    parts = partitioners.iid(LABELS.size, 4, seed=0)
    test_parts = [np.array([0, 1, 2]), np.array([3]), np.array([], np.int64), np.array([4, 5])]
    data = federate(
        parts,
        test_xs=[FEATURES[p] for p in test_parts],
        test_ys=[LABELS[p] for p in test_parts],
    )
    summary = diagnostics.describe(data)
    assert summary["test_sizes"]["max"] == 3 and summary["test_sizes"]["min"] == 0
    assert summary["test_sizes"]["median"] == 1.5
    assert summary["clients_without_test"] == 1
    assert "test examples" in diagnostics.format_report(summary)


def test_format_report_names_every_measure():
    report = diagnostics.format_report(diagnostics.describe(federate(one_class_per_client(20))))
    for needle in ("clients: 20", "train examples", "classes per client", "JS to global", "TV"):
        assert needle in report
    assert "Gini of train sizes" in report


@pytest.mark.parametrize("num_clients", [30, 250])
def test_save_report_writes_a_json_that_round_trips_and_a_png(tmp_path, num_clients):
    data = federate(one_class_per_client(num_clients), name="toy")
    summary = diagnostics.save_report(data, tmp_path / "run")
    written = json.loads((tmp_path / "run" / "data_summary.json").read_text())
    assert written == summary == diagnostics.describe(data)
    png = (tmp_path / "run" / "label_heatmap.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_heatmap_caps_rows_sorts_by_dominant_class_and_says_so(tmp_path, monkeypatch):
    import matplotlib.axes

    titles = []
    original = matplotlib.axes.Axes.set

    def recording_set(self, **kwargs):
        titles.append(kwargs.get("title"))
        return original(self, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "set", recording_set)
    counts = np.eye(NUM_CLASSES, dtype=int)[np.arange(250) % NUM_CLASSES]
    shown = diagnostics.plot_label_heatmap(counts, tmp_path / "capped.png")
    assert shown.size == 200 and np.unique(shown).size == 200
    dominant = [int(np.argmax(counts[k])) for k in shown]
    assert dominant == sorted(dominant) and set(dominant) == set(range(NUM_CLASSES))
    shown = diagnostics.plot_label_heatmap(counts[:20], tmp_path / "all.png")
    assert sorted(shown.tolist()) == list(range(20))
    assert titles == [
        "label shares per client\n200 of 250 clients (evenly spaced), sorted by dominant class",
        "label shares per client\n20 clients, sorted by dominant class",
    ]
