"""Every option discoverable: ``fedjax-het explain KEY`` and ``fedjax-het config --all``, both
generated from the schema that checks a config (``config.options``)."""

import tomllib

import pytest

from fedjax_het import registry
from fedjax_het.front import cli, config, explain
from fedjax_het.gandalf.pipeline import MEDIATED
from fedjax_het.schema import documented

TINY = [
    'data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3",
    "model.name=logistic_regression", "rounds=2", "eval_every=1",
]  # fmt: skip
CENTRALISED = ["data.num_clients=10", "sampler.clients_per_round=3", "rounds=2", "eval_every=1"]


def _sets(overrides) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def test_every_key_of_every_choice_is_described():
    """Walks every table and every registered algorithm, sampler, selection, dataset,
    partitioner, skew and model: a key without a description fails, naming where it is."""
    undescribed, chosen = [], set()
    for choice, variant in explain.variants():
        chosen.add(choice)
        options = config.options(variant)
        assert set(options) == set(config.schema(variant))
        undescribed += [f"{key} ({choice or 'default config'})" for key, spec in options.items()
                        if not spec.doc]  # fmt: skip
    assert undescribed == []
    for kind in ("algorithm", "selection"):
        for name in registry.names(kind):
            assert f'{kind}.name = "{name}"' in chosen
    for name in MEDIATED:
        assert f'algorithm.name = "{name}"' in chosen
    assert registry.names("sampler") == list(config.options(config.load())["sampler.name"].choices)


def test_docstring_entries_are_read_with_their_continuations_and_references():
    def factory(*, a: int = 1, b: float = 2.0, c: str = "x"):
        """Summary.

        Args:
          a: the first,
            continued.
          b, c: both of
            these.

        Returns:
          nothing: not an entry.

        References:
          Someone, "A Paper" (2020).
        """

    entries, paper = documented(factory)
    assert entries == {"a": "the first, continued.", "b": "both of these.", "c": "both of these."}
    assert paper == 'Someone, "A Paper" (2020).'


def test_explain_says_type_range_default_what_and_paper():
    text = explain.explain("algorithm.prox_mu")
    for fragment in ("proximal term", "a finite number", "[0, inf)", "0.01", "MLSys 2020",
                     'with algorithm.name = "fedprox"'):  # fmt: skip
        assert fragment in text
    text = explain.explain("policy.deadline")
    assert "120.0" in text and "seconds" in text and "ICC 2019" in text
    assert "one of 'float32', 'bfloat16', 'float64'" in explain.explain("engine.precision")
    assert "inf (transfers take no time)" in explain.explain("system.bandwidth")
    assert 'also "fedyogi"' in explain.explain("algorithm.server_b1")


def test_explain_follows_the_config_given():
    """A key of the config's own choice is explained with that choice's default."""
    assert "0.01" in explain.explain(
        "algorithm.server_lr", config.load(None, ["algorithm.name=fedadam"])
    )
    assert "1.0" in explain.explain("algorithm.server_lr")


def test_explain_on_the_command_line(capsys):
    assert cli.main(["explain", "policy.deadline"]) == 0
    assert capsys.readouterr().out.startswith("policy.deadline\n  what ")
    assert cli.main(["explain", "algorithm.clientlr"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert "unknown key 'algorithm.clientlr' (did you mean 'algorithm.client_lr'?)" in captured.err


def _all(capsys, overrides) -> str:
    assert cli.main(["config", "--all", *_sets(overrides)]) == 0
    return capsys.readouterr().out


def _blocks(text: str) -> dict[str, str]:
    """The commented-out optional tables of ``config --all``'s text, uncommented, by name."""
    out = {}
    for block in text.split("\n\n"):
        lines = block.splitlines()
        header = next((line for line in lines if line.startswith("# [")), None)
        if header is not None and all(line.startswith("# ") for line in lines):
            out[header[3:-1]] = "\n".join(line[2:] for line in lines)
    return out


def test_config_all_is_a_config_that_rebuilds_itself(tmp_path, capsys):
    text = _all(capsys, CENTRALISED)
    first = config.build(config.load(None, CENTRALISED)).config
    assert {k: v for k, v in tomllib.loads(text).items() if k != "algorithm"} == {
        k: v for k, v in first.items() if k != "algorithm"
    }
    path = tmp_path / "all.toml"
    path.write_text(text)
    again = config.build(config.load(path)).config
    assert again["algorithm"].items() >= first["algorithm"].items()
    assert {k: v for k, v in again.items() if k != "algorithm"} == {
        k: v for k, v in first.items() if k != "algorithm"
    }


def test_uncommenting_an_optional_table_gives_a_config_that_builds(tmp_path, capsys):
    text = _all(capsys, CENTRALISED)
    blocks = _blocks(text)
    assert set(blocks) == {"feature_skew", "system", "policy", "selection", "server",
                           "compression", "privacy", "logging"}  # fmt: skip
    for table, block in blocks.items():
        needed = [blocks["system"]] if table == "selection" else []
        path = tmp_path / f"{table}.toml"
        path.write_text("\n\n".join([text, *needed, block]) + "\n")
        experiment = config.build(config.load(path))
        assert experiment.config.get(table), table


@pytest.mark.parametrize("name", [*registry.names("algorithm"), *MEDIATED])
def test_config_all_of_every_algorithm_builds(name, tmp_path, capsys):
    # an MLP: the sub-model algorithms (heterofl, fjord, fedrolex) need hidden units to mask
    overrides = [*TINY, "model.name=mlp", 'policy.kind="deadline"', f"algorithm.name={name!r}"]
    path = tmp_path / "all.toml"
    path.write_text(_all(capsys, overrides))
    rebuilt = config.build(config.load(path))
    assert rebuilt.config["algorithm"]["name"] == name
    assert rebuilt.hyper.items() >= config.build(config.load(None, overrides)).hyper.items()


def test_config_all_lists_every_choice_of_an_optional_table_with_its_keys(capsys):
    selection = _blocks(_all(capsys, CENTRALISED))["selection"]
    choices, current = {}, None
    for line in selection.splitlines():  # uncommented once: the first choice live, others "# "
        text = line.removeprefix("# ")
        if text.startswith("name = "):
            current = choices.setdefault(tomllib.loads(text)["name"], [])
        elif current is not None and " = " in text:
            key = text.split(" = ")[0]  # "# key = (its type; none: ...)": a required key
            if not key.startswith("#") or text.split(" = ")[1].startswith("("):
                current.append(key.removeprefix("# "))
    assert set(choices) == set(registry.names("selection"))
    with_system = config.load(None, [*CENTRALISED, 'system.devices="lognormal"'])
    for name, keys in choices.items():
        table = {**with_system, "selection": {"name": name}}
        expected = {k.split(".")[1] for k in config.options(table) if k.startswith("selection.")}
        assert set(keys) == expected - {"name"}, name
    assert "# candidates = (an integer of 32 bits; none: it must be given)" in selection
