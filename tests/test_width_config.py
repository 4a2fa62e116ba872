"""The width options of FjORD, HeteroFL and FedRolex in a config (issue 22, item 6):
``algorithm.widths`` and ``algorithm.width_from``, each bad value refused in one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedjax_het.front import config, explain
from fedjax_het.schema import ConfigError

N = 8


def build(algorithm: dict, **tables):
    raw = {"rounds": 1, "data": {"name": "synthetic", "num_clients": N}, "model": {"name": "mlp"},
           "sampler": {"clients_per_round": 4}, "algorithm": algorithm, **tables}
    return config.build(config.merge_defaults(raw))


SYSTEM = {"system": {"devices": "lognormal"}, "policy": {"kind": "wait_all"}}


@pytest.mark.parametrize(
    ("algorithm", "tables", "message"),
    [
        ({"name": "heterofl", "widths": [1.0, 1.5]}, {}, "widths: a width ratio must lie in (0, 1]"),
        ({"name": "fjord", "widths": [0.5, 0.0]}, {}, "widths: a width ratio must lie in (0, 1]"),
        ({"name": "fedrolex", "widths": [0.5, 1.0]}, {}, "widths must be strictly decreasing"),
        ({"name": "heterofl", "widths": [0.5, 0.5]}, {}, "widths must be strictly decreasing"),
        ({"name": "fjord", "width_from": "speed"}, {}, "width_from = 'speed'"),
        ({"name": "fjord", "width_from": "fast"}, {}, "width_from must be one of"),
        ({"name": "fjord", "width_from": "speed", "client_levels": [0] * N}, SYSTEM,
         "give one of the two"),
        ({"name": "heterofl"}, {"model": {"name": "logistic_regression"}},
         "model.name = 'logistic_regression'"),
        ({"name": "heterofl", "client_levels": [0, 1]}, {}, "client_levels names 2 clients"),
        ({"name": "heterofl", "widths": [1.0, 0.5], "client_levels": [0, 2] * 4}, {},
         "client_levels: level 2 is not an index"),
    ],
)
def test_a_bad_width_option_is_one_line(algorithm, tables, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")) as err:
        build(algorithm, **tables)
    assert "\n" not in str(err.value)


def test_the_logistic_refusal_names_the_missing_hidden_units():
    with pytest.raises(ConfigError, match="no hidden units to mask"):
        build({"name": "heterofl"}, model={"name": "logistic_regression"})


def test_width_from_speed_gives_the_fastest_devices_the_widest_model():
    experiment = build({"name": "fjord", "widths": [1.0, 0.5], "width_from": "speed"}, **SYSTEM)
    step_time = np.asarray(experiment.system.profiles.step_time)
    levels = np.asarray(experiment.algorithm.server_init(
        experiment.model.init(jax.random.key(0)), experiment.algorithm.hyper(), N
    ).levels)
    fastest = np.argsort(step_time, kind="stable")[: N // 2]
    np.testing.assert_array_equal(levels, np.isin(np.arange(N), fastest, invert=True))
    # The resolved config derives them again from the same system: it keeps width_from.
    assert experiment.config["algorithm"]["width_from"] == "speed"
    assert "client_levels" not in experiment.config["algorithm"]


def test_width_from_uniform_is_round_robin_without_a_system():
    experiment = build({"name": "heterofl", "widths": [1.0, 0.5, 0.25]})
    state = experiment.algorithm.server_init(experiment.model.init(jax.random.key(0)),
                                             experiment.algorithm.hyper(), N)
    np.testing.assert_array_equal(state.levels, np.arange(N) % 3)


@pytest.mark.parametrize("key", ["algorithm.widths", "algorithm.width_from"])
def test_explain_describes_the_width_options(key):
    text = explain.explain(key)
    assert key in text and "fjord" in text and "heterofl" in text
