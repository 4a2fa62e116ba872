"""How heterogeneous is a federated dataset? Sizes, label skew and a clients x classes heatmap.

:func:`describe` summarises a :class:`~fedjax_het.data.federated.FederatedData` (training split
unless stated) in a JSON-ready dict; :func:`format_report` prints it as a text table and
:func:`save_report` writes it to a run directory as ``data_summary.json`` and
``label_heatmap.png``.

Measures (Q is a client's label distribution, P the pooled one of all training examples, both
over the C classes; every client counts once in the mean, whatever its size):

- Gini coefficient of client sizes, G = sum_i sum_j |n_i - n_j| / (2 K^2 mean(n)) over the K
  clients (Gini, "Variabilita e mutabilita", 1912): 0 when all sizes are equal,
  (K - 1) / K when one client holds everything.
- Jensen-Shannon divergence with base-2 logarithms (the equal-weight case of Lin, "Divergence
  measures based on the Shannon entropy", IEEE Trans. Inf. Theory 37(1), 1991), JS(Q, P) = KL(Q || M) / 2 + KL(P || M) / 2 with M = (Q + P) / 2; it lies in [0, 1].
- Total variation distance, TV(Q, P) = sum_c |Q_c - P_c| / 2, in [0, 1]. It equals the earth
  mover's distance when classes are unordered, i.e. when moving mass between any two distinct
  classes costs 1 (Rubner, Tomasi and Guibas, IJCV 40(2), 2000, with that ground distance).
- Classes per client: how many classes a client holds at least one example of.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedjax_het import results
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.data.partitioners import label_histogram

MAX_HEATMAP_CLIENTS = 200
"""The heatmap shows at most this many clients (rows)."""


def gini(values: np.ndarray) -> float:
    """Gini coefficient of non-negative values: 0 for all equal, (K - 1) / K for one non-zero.

    Computed from the sorted values x_(1) <= ... <= x_(K) as
    G = 2 sum_i i x_(i) / (K sum_i x_i) - (K + 1) / K, which equals the mean absolute
    difference over all ordered pairs divided by twice the mean. NumPy in float64 on any
    array-like (JAX arrays included, e.g. ``flhetbench.participation_counts``); not traceable.

    >>> gini(np.array([5, 5, 5])), gini(np.array([0, 0, 0, 8]))
    (0.0, 0.75)
    """
    values = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if values.size == 0 or np.any(values < 0):
        raise ValueError("values must be a non-empty array of numbers >= 0")
    total = values.sum()
    if total == 0:
        return 0.0
    k = values.size
    ranks = np.arange(1, k + 1)
    return float(2.0 * np.dot(ranks, values) / (k * total) - (k + 1) / k)


def jensen_shannon(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence in bits (in [0, 1]) between distributions along the last axis.

    ``q`` and ``p`` broadcast against each other; each must sum to 1 along the last axis.
    Terms with zero probability contribute 0 (0 log 0 = 0).

    >>> float(jensen_shannon(np.array([1.0, 0.0]), np.array([0.0, 1.0])))
    1.0
    """
    q, p = np.broadcast_arrays(np.asarray(q, np.float64), np.asarray(p, np.float64))
    middle = (q + p) / 2
    return (_kl_bits(q, middle) + _kl_bits(p, middle)) / 2


def total_variation(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Total variation distance sum_c |q_c - p_c| / 2 along the last axis (= EMD, unordered classes).

    >>> float(total_variation(np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.5, 0.5])))
    0.5
    """
    return np.abs(np.asarray(q, np.float64) - np.asarray(p, np.float64)).sum(axis=-1) / 2


def client_label_counts(split: ClientArrays, num_classes: int) -> np.ndarray:
    """``[num_clients, num_classes]`` int64: entry (k, c) counts client k's examples of class c
    (with sequence labels ``[n, positions]``, its positions of class c)."""
    per_row = int(np.prod(split.y.shape[1:]))
    rows = [np.arange(start * per_row, (start + n) * per_row)
            for start, n in zip(split.offset, split.count)]
    return label_histogram(rows, split.y.reshape(-1), num_classes)


def describe(data: FederatedData) -> dict[str, Any]:
    """Summarises the heterogeneity of ``data`` (module docstring gives every measure).

    Returns:
      A JSON-ready dict: ``name``, ``num_clients``, ``num_classes``, ``num_examples``;
      ``sizes`` (training examples per client: ``min``, ``median``, ``max``, ``mean``,
      ``gini``); ``classes_per_client``, ``js_to_global`` and ``tv_to_global`` (each ``min``,
      ``median``, ``max``, ``mean`` over clients); ``global_label_distribution`` (``[C]``);
      ``label_histogram`` (``[K][C]`` training counts); and, when ``data`` has a test split,
      ``test_sizes`` (the same four statistics plus ``gini``) and ``clients_without_test``.

    >>> data = FederatedData.from_client_arrays(
    ...     [np.zeros((2, 1)), np.zeros((2, 1))], [np.array([0, 0]), np.array([1, 1])])
    >>> summary = describe(data)
    >>> summary["sizes"]["gini"], summary["classes_per_client"]["max"], summary["tv_to_global"]["max"]
    (0.0, 1.0, 0.5)
    """
    counts = client_label_counts(data.train, data.num_classes)
    sizes = counts.sum(axis=1)
    client_dist = counts / sizes[:, None]
    global_dist = counts.sum(axis=0) / counts.sum()
    summary: dict[str, Any] = {
        "name": data.name,
        "num_clients": data.num_clients,
        "num_classes": data.num_classes,
        "num_examples": int(sizes.sum()),
        "sizes": {**_stats(sizes), "gini": gini(sizes)},
        "classes_per_client": _stats(np.count_nonzero(counts, axis=1)),
        "js_to_global": _stats(jensen_shannon(client_dist, global_dist)),
        "tv_to_global": _stats(total_variation(client_dist, global_dist)),
        "global_label_distribution": global_dist.tolist(),
        "label_histogram": counts.tolist(),
    }
    if data.test is not None:
        summary["test_sizes"] = {**_stats(data.test.count), "gini": gini(data.test.count)}
        summary["clients_without_test"] = int(np.count_nonzero(data.test.count == 0))
    return summary


def format_report(summary: dict[str, Any]) -> str:
    """A readable text table of a :func:`describe` summary.

    >>> data = FederatedData.from_client_arrays(
    ...     [np.zeros((2, 1)), np.zeros((4, 1))], [np.array([0, 0]), np.array([0, 1, 1, 1])])
    >>> print(format_report(describe(data)))
    data: data   clients: 2   examples: 6   classes: 2
                               min    median       max      mean
    train examples           2.000     3.000     4.000     3.000
    classes per client       1.000     1.500     2.000     1.500
    JS to global (bits)      0.049     0.180     0.311     0.180
    TV to global             0.250     0.375     0.500     0.375
    Gini of train sizes: 0.167
    """
    heading = (
        f"data: {summary['name']}   clients: {summary['num_clients']}   "
        f"examples: {summary['num_examples']}   classes: {summary['num_classes']}"
    )
    lines = [
        heading,
        f"{'':20}" + "".join(f"{column:>10}" for column in _STAT_NAMES),
    ]
    rows = [
        ("train examples", "sizes"),
        ("test examples", "test_sizes"),
        ("classes per client", "classes_per_client"),
        ("JS to global (bits)", "js_to_global"),
        ("TV to global", "tv_to_global"),
    ]
    for label, key in rows:
        if key in summary:
            lines.append(f"{label:20}" + "".join(f"{summary[key][s]:10.3f}" for s in _STAT_NAMES))
    lines.append(f"Gini of train sizes: {summary['sizes']['gini']:.3f}")
    if "clients_without_test" in summary:
        lines.append(f"clients without test examples: {summary['clients_without_test']}")
    return "\n".join(lines)


def save_report(data: FederatedData, out_dir: str | Path) -> dict[str, Any]:
    """Writes ``data_summary.json`` (the :func:`describe` dict) and ``label_heatmap.png``.

    Returns:
      The summary that was written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = describe(data)
    (out_dir / "data_summary.json").write_text(results.strict_json(summary) + "\n")
    plot_label_heatmap(np.asarray(summary["label_histogram"]), out_dir / "label_heatmap.png")
    return summary


def plot_label_heatmap(
    counts: np.ndarray, path: str | Path, max_clients: int = MAX_HEATMAP_CLIENTS
) -> np.ndarray:
    """Heatmap of each client's label distribution (rows: clients, columns: classes).

    Rows are sorted by dominant class, then by that class's share (largest first). With more
    than ``max_clients`` clients, ``max_clients`` rows evenly spaced in that order are shown;
    the title says how many.

    Args:
      counts: ``[clients, classes]`` label counts.
      path: where the PNG goes.
      max_clients: the most rows shown.

    Returns:
      The client ids shown, top row first.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] == 0:
        raise ValueError(f"counts must be [clients, classes] with >= 1 client, got {counts.shape}")
    if max_clients < 1:
        raise ValueError(f"max_clients must be >= 1, got {max_clients}")
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    dominant = shares.argmax(axis=1)
    order = np.lexsort((-shares.max(axis=1), dominant))
    num_clients = order.size
    if num_clients > max_clients:
        order = order[np.linspace(0, num_clients - 1, max_clients).round().astype(int)]
        title = f"{max_clients} of {num_clients} clients (evenly spaced), sorted by dominant class"
    else:
        title = f"{num_clients} clients, sorted by dominant class"
    fig, ax = plt.subplots(figsize=(min(max(7, 2 + 0.25 * counts.shape[1]), 16), 6))
    image = ax.imshow(
        shares[order], aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=1.0
    )
    ax.set(xlabel="class", ylabel="client (sorted)", title=f"label shares per client\n{title}")
    fig.colorbar(image, ax=ax, label="share of the client's training examples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return order


_STAT_NAMES = ("min", "median", "max", "mean")


def _stats(values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    return {
        "min": float(values.min()),
        "median": float(np.median(values)),
        "max": float(values.max()),
        "mean": float(values.mean()),
    }


def _kl_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """KL(a || b) in bits along the last axis, where b > 0 wherever a > 0."""
    ratio = np.where(a > 0, a / np.where(b > 0, b, 1.0), 1.0)
    return np.sum(a * np.log2(ratio), axis=-1)
