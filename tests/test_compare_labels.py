"""``fedjax-het compare``'s labels and figure on hand-made runs: short automatic labels, names
given by ``--label`` or ``logging.name``, and a legend outside the axes that nothing clips."""

from __future__ import annotations

import copy

import matplotlib.pyplot as plt
import pytest

from fedjax_het import results
from fedjax_het.front import cli, compare

BASE = {
    "seed": 0,
    "rounds": 4,
    "eval_every": 2,
    "data": {"name": "fashion_mnist", "num_clients": 100},
    "algorithm": {"name": "fedavg", "client_lr": 0.05, "server_lr": 1.0},
    "engine": {"chunk": 0, "compile_cache": True},
    "logging": {"tensorboard": False},
}


def _fedprox_at(lr: float) -> dict:
    """FedProx in place of FedAvg: the choice brings its options (prox_mu, ...) along."""
    config = copy.deepcopy(BASE)
    config["algorithm"] = {
        "name": "fedprox",
        "client_lr": lr,
        "prox_mu": 0.01,
        "server_optimizer": "sgd",
        "server_momentum": 0.0,
    }
    config["engine"]["compile_cache"] = False  # changes nothing computed
    return config


def _write(root, name: str, config: dict, accuracy: float):
    writer = results.RunWriter(root / name, config)
    for r, a in ((0, 0.1), (2, accuracy / 2), (4, accuracy)):
        writer.append({"round": r, "test_accuracy": a, "wall_s": float(r)})
    return root / name


def test_automatic_labels_name_the_choice_and_the_options_that_differ(tmp_path):
    runs = [_write(tmp_path, "a", BASE, 0.6), _write(tmp_path, "b", _fedprox_at(0.1), 0.7)]
    labels = [g.label for g in compare.compare(runs).groups]
    assert labels == ["fedavg, client_lr=0.05", "fedprox, client_lr=0.1"]
    flats = [{"a.x": 1, "b.x": 1, "c": 1, "d": 1, "e": 1}, {"a.x": 2, "b.x": 2, "c": 2, "d": 2}]
    assert compare.short_labels(flats) == ["a.x=1, b.x=1, c=1 +2 more", "a.x=2, b.x=2, c=2 +2 more"]


def test_labels_given_by_option_or_config(tmp_path, capsys):
    named = copy.deepcopy(BASE) | {"logging": {"name": "baseline"}}
    runs = [_write(tmp_path, "a", named, 0.6), _write(tmp_path, "b", _fedprox_at(0.1), 0.7)]
    assert [g.label for g in compare.compare(runs).groups] == ["baseline", "fedprox, client_lr=0.1"]
    given = compare.compare(runs, labels=["A", "B"]).groups
    assert [g.label for g in given] == ["A", "B"]
    out = tmp_path / "cmp.png"
    args = [
        "compare",
        *map(str, runs),
        "--label",
        "FedAvg",
        "--label",
        "FedProx",
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    assert "| FedAvg | 1 |" in capsys.readouterr().out
    assert (
        cli.main(
            [
                "compare",
                str(runs[0]),
                "--label",
                "x",
                "--label",
                "y",
                "--out",
                str(tmp_path / "c2.png"),
            ]
        )
        == 2
    )
    assert "2 labels for 1 run directories" in capsys.readouterr().err


@pytest.mark.parametrize("label", ["fedprox, client_lr=0.1", "a label far longer " * 8])
def test_the_legend_sits_outside_the_axes_and_is_not_clipped(tmp_path, label):
    runs = [_write(tmp_path, "a", BASE, 0.6), _write(tmp_path, "b", _fedprox_at(0.1), 0.7)]
    groups = compare.compare(runs, labels=["fedavg", label]).groups
    fig = compare.figure(groups, "round", "test_accuracy")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box, axes, whole = (
        legend.get_window_extent(renderer),
        fig.axes[0].get_window_extent(renderer),
        fig.bbox,
    )
    assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0 and box.y1 <= whole.y1
    assert box.x0 >= axes.x1  # beside the axes: it covers no curve
    texts = [t.get_text() for t in legend.get_texts()]
    assert all(max(map(len, t.splitlines())) <= 28 for t in texts)  # wrapped, whole
    assert "".join(texts[1].split()) == "".join(f"{label} (n=1)".split())
    plt.close(fig)
