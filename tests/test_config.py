"""Configs: defaults, overrides, a resolved config that reproduces itself, and clear errors."""

import tomllib

import numpy as np
import pytest

from fedjax_het import results
from fedjax_het.front import config

TINY = [
    'data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3",
    "model.name=logistic_regression", "rounds=2", "eval_every=1",
]


def build(*overrides):
    return config.build(config.load(None, [*TINY, *overrides]))


def test_defaults_are_the_documented_default_experiment():
    experiment = config.build(config.load())
    assert experiment.data.name == "fashion_mnist"
    assert experiment.data.num_clients == 100
    assert experiment.sampler.cohort_size == 10
    assert experiment.algorithm.name == "fedavg"
    assert experiment.config["partition"] == {
        "kind": "dirichlet", "beta": 0.5, "min_size": 10, "max_tries": 100,
    }


def test_overrides_are_typed_toml_values():
    assert config.parse_override("algorithm.client_lr=0.1") == ("algorithm.client_lr", 0.1)
    assert config.parse_override("model.hidden=[8, 8]") == ("model.hidden", [8, 8])
    assert config.parse_override("algorithm.name=fedadam") == ("algorithm.name", "fedadam")
    experiment = build("algorithm.client_lr=0.5", "local.steps=3")
    assert experiment.hyper == {"client_lr": 0.5}
    assert experiment.work.steps == 3 and experiment.work.epochs is None


def test_resolved_config_rebuilds_to_itself(tmp_path):
    first = build("algorithm.name=fedavgm").config
    path = tmp_path / "config.toml"
    path.write_text(results.to_toml(first))
    assert tomllib.loads(path.read_text()) == first
    assert config.build(config.load(path)).config == first


def test_switching_algorithm_drops_the_old_defaults():
    experiment = build("algorithm.name=fedadam")
    assert experiment.algorithm.name == "fedadam"
    assert "server_b1" in experiment.config["algorithm"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("colour=1", "unknown top-level key 'colour'"),
        ("algorithm.clientlr=0.1", "unknown key 'algorithm.clientlr' (did you mean 'algorithm.client_lr'?)"),
        ("data.clients=4", "unknown key 'data.clients'"),
        ("model.name=resnet9000", "unknown model.name 'resnet9000'"),
        ("algorithm.name=fedsgd", "unknown algorithm.name 'fedsgd'"),
        ("engine.chunks=2", "unknown key 'engine.chunks'"),
        ("sampler.clients_per_round=7", "sampler.clients_per_round must be between 1 and data.num_clients=6"),
        ("algorithm.client_lr=-0.1", "algorithm.client_lr must lie in (0, inf), got -0.1"),
        ("algorithm.client_lr=true", "algorithm.client_lr must be a number"),
        ("local.batch_size=2.5", "local.batch_size must be an integer"),
        ("local.batch_size=0", "batch_size must be >= 1"),
        ("rounds=0", "rounds must be >= 1"),
        ("engine.weighting=size", "engine.weighting must be 'examples' or 'uniform'"),
        ("data.alpha=-1.0", "alpha must be finite and >= 0"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(config.ConfigError) as err:
        build(override)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["partition.beta=0.0"], "beta"),
        (["partition.kind=classes_per_client", "partition.c=11"], "c"),
        (["partition.kind=dirichlet_by_magic"], "unknown partition.kind 'dirichlet_by_magic'"),
        (["partition.bta=0.5"], "unknown key 'partition.bta'"),
    ],
)
def test_partition_errors(overrides, message):
    with pytest.raises(config.ConfigError) as err:
        config.build(config.load(None, overrides))
    assert message in str(err.value)


def test_partition_with_a_natural_dataset_is_refused():
    with pytest.raises(config.ConfigError, match=r"\[partition\] does not apply"):
        build("partition.kind=iid")


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3\n")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(bad)


def test_a_required_dataset_option_is_named():
    with pytest.raises(config.ConfigError, match="data.path is required"):
        config.build(config.load(None, ["data.name=leaf"]))



def test_feature_skew_table_transforms_each_client(tmp_path):
    plain = config.build(config.load(None, ["data.num_clients=10", "partition.kind=iid"])).data
    rotated = config.build(config.load(None, [
        "data.num_clients=10", "partition.kind=iid",
        "feature_skew.kind=rotation", "feature_skew.angle=90.0",
    ])).data
    # Same split; the last client is rotated by the full 90 degrees, the first not at all.
    x0, _ = plain.train.client(9)
    x1, _ = rotated.train.client(9)
    np.testing.assert_allclose(x1, np.rot90(x0, k=1, axes=(1, 2)), atol=1e-5)
    np.testing.assert_array_equal(plain.train.client(0)[0], rotated.train.client(0)[0])
    np.testing.assert_allclose(
        rotated.test.client(9)[0], np.rot90(plain.test.client(9)[0], k=1, axes=(1, 2)), atol=1e-5
    )


def test_feature_skew_errors():
    with pytest.raises(config.ConfigError, match="unknown feature_skew.kind 'rot'"):
        config.build(config.load(None, ["feature_skew.kind=rot"]))
    with pytest.raises(config.ConfigError, match="applies to centralised datasets"):
        build("feature_skew.kind=rotation")


def test_system_and_policy_tables():
    experiment = build("policy.kind=deadline", "policy.deadline=30.0", "system.devices=lognormal")
    assert experiment.system.policy.kind == "deadline"
    assert float(experiment.system.policy.deadline) == 30.0
    assert experiment.system.profiles.num_clients == 6
    assert experiment.config["system"]["devices"] == "lognormal"
    assert build().system is None and "system" not in build().config


def test_selection_table_builds_a_learned_selection():
    experiment = build("policy.kind=wait_all", 'selection.name="power_of_choice"',
                       "selection.candidates=4")
    assert experiment.run_kwargs()["select"] is experiment.select is not None
    assert experiment.config["selection"] == {"name": "power_of_choice", "candidates": 4}
    assert build().select is None and "selection" not in build().config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["policy.kind=dead"], "policy.kind must be one of wait_all, deadline, readiness"),
        (["policy.kind=deadline", "policy.deadline=-3.0"], "deadline must be > 0 seconds"),
        (["policy.kind=readiness", "policy.readiness=1.5"], "policy.readiness is the share"),
        (["system.dropout=2.0"], "system.dropout must be a probability in [0, 1)"),
        (["system.devices=phones"], "system.devices must be one of uniform, lognormal, flash"),
        (["system.speed=3.0"], "unknown key 'system.speed'"),
        (["policy.start=-1.0"], "start must be >= 0 seconds"),
        (['selection.name="power_of_choice"', "selection.candidates=4"],
         "selection needs a [system]"),
        (["policy.kind=wait_all", 'selection.name="power_of_choice"', "selection.candidates=1"],
         "need 1 <= num_slots <= candidates"),
        (["policy.kind=wait_all", 'selection.name="power_of_choice"', "selection.k=1"],
         "unknown key 'selection.k'"),
        (['algorithm.name="freezefl"'], "it needs a [system]"),
    ],
)
def test_system_errors(overrides, message):
    with pytest.raises(config.ConfigError) as err:
        build(*overrides)
    assert message in str(err.value)
