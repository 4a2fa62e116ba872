"""The bad-input corpus, continued (issue "Nothing silent, nothing stuck, nothing lost", items
1-3 and 8): sizes no device holds, keys that do nothing, values that cannot make sense and
messages that named internals. Each case is one line on stderr, exit code 2 and no run
directory, through ``cli.main`` as in ``tests/test_bad_inputs.py``.
"""

from __future__ import annotations

import importlib.abc
import sys

import numpy as np
import pytest
from test_bad_inputs import POLICY, _check_refused, _sets, case, run, write

from fedjax_het.data import catalog
from fedjax_het.data import tfds as tfds_loader
from fedjax_het.engine import memory
from fedjax_het.front import cli, config

SMALL = ('data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3")
LOGNORMAL = ('system.devices="lognormal"',)  # a [system] without a [policy] kind
ASYNC = (*LOGNORMAL, 'server.mode="async"', "server.concurrency=4", "server.buffer_size=2")
GANDALF = 'algorithm.name="gandalf"'
BIG = 1_000_000_000


def small(*overrides: str) -> tuple[str, ...]:
    return run(*SMALL, *overrides)


def csv_trace(tmp) -> None:
    """An availability trace whose second interval ends at an Arabic-Indic three ("٣")."""
    rows = ["client,start_s,end_s"] + [f"{k},0,40000" for k in range(6)]
    rows[2] = "1,0,\u0663"
    (tmp / "trace.csv").write_text("\n".join(rows) + "\n")


# Item 1: every size a config sets is priced before anything is built on it.
SIZE_CASES = [
    case("local.steps=1e9", small(f"local.steps={BIG}"), "local.steps = 1000000000", "int32"),
    case("local.max_steps=1e9", small(f"local.max_steps={BIG}"), "local.max_steps = 1000000000"),
    case("local.epochs=1e9", small("local.epochs=1e9"), "local.epochs = 1e+09", "local steps"),
    case("local.epochs beyond every float step count", small("local.epochs=1e30"),
         "local.epochs = 1e+30"),
    case("engine.eval_batch_size=1e9", small(f"engine.eval_batch_size={BIG}"),
         "engine.eval_batch_size = 1000000000", "does not fit the device"),
    case("bernoulli availability_slots=1e9",
         small('system.availability="bernoulli"', f"system.availability_slots={BIG}"),
         "system.availability_slots = 1000000000"),
    case("policy.over_commit=1e9", small("policy.over_commit=1e9"), "policy.over_commit = 1e+09",
         "more than the 6 clients"),
    case("policy.over_commit beyond the clients", small("policy.over_commit=1.5"),
         "policy.over_commit = 1.5", "= 8 clients", "at most 1"),
    case("rounds of a schedule beyond int32", small(*LOGNORMAL, "rounds=2000000000"),
         "rounds = 2000000000", "the run's schedule"),
    case("server.max_staleness ring", small(*ASYNC, f"server.max_staleness={BIG}"),
         "server.max_staleness = 1000000000", "ring of"),
    case("policy.max_staleness ring", small(*POLICY, f"policy.max_staleness={BIG}"),
         "policy.max_staleness = 1000000000", "ring of"),
    case("synthetic data.num_clients=1e9", run('data.name="synthetic"', f"data.num_clients={BIG}"),
         "data.num_clients = 1000000000 and data.num_features = 60"),
    case("synthetic data.num_features=1e9",
         run('data.name="synthetic"', f"data.num_features={BIG}"), "data.num_features = 1000000000"),
    case("a model of 1e9 hidden units", small('model.name="mlp"', f"model.hidden=[{BIG}]"),
         "model.name = 'mlp' with hidden = [1000000000] makes params"),
    case("algorithm.name=[1]", run("algorithm.name=[1]"), "unknown algorithm.name [1]"),
    case("algorithm.name is a table", run("algorithm.name={a=1}"), "unknown algorithm.name"),
    case("data.name=[1]", run("data.name=[1]"), "unknown data.name [1]"),
    case("model.name=[1]", run("model.name=[1]"), "unknown model.name [1]"),
    case("a TOML file of 5,000 nested arrays", run(path="{tmp}/deep.toml"), "nest too deeply",
         prepare=write("deep.toml", b"rounds = " + b"[" * 5000 + b"]" * 5000 + b"\n")),
    case("a TOML file of 3,000 nested inline tables", run(path="{tmp}/deep.toml"),
         "nest too deeply",
         prepare=write("deep.toml", b"rounds = " + b"{a=" * 3000 + b"1" + b"}" * 3000 + b"\n")),
    case("a table header 5,000 keys deep", run(path="{tmp}/deep.toml"),
         "data nests tables or arrays more than",
         prepare=write("deep.toml", b"[" + b".".join([b"data"] * 5000) + b"]\n")),
    case("--set a key 5,000 tables deep", run(".".join(["data"] * 5000) + "=1"),
         "data nests tables or arrays more than"),
    case("--set a value of 3,000 nested arrays", run("rounds=" + "[" * 3000 + "]" * 3000),
         "--set rounds: the value nests too deeply"),
]

# Item 2: a key that does nothing where it is set is refused, saying why; so is a value that
# cannot make sense.
INERT = "does nothing here"
SILENT_CASES = [
    case("ifca num_clusters above the clients",
         small('algorithm.name="ifca"', "algorithm.num_clusters=1000"),
         "algorithm.num_clusters must be at most the 6 clients"),
    case("local.max_steps below local.steps", small("local.steps=10", "local.max_steps=5"),
         "local.max_steps = 5 caps every client at local.steps = 10"),
    case("local.max_steps beside local.steps", small("local.steps=5", "local.max_steps=5"),
         "local.max_steps = 5 does nothing beside local.steps = 5"),
    case("on_late under wait_all", run('policy.kind="wait_all"', 'policy.on_late="partial"'),
         "policy.on_late", INERT, "policy.kind = 'deadline'", "policy.kind = 'wait_all'"),
    case("on_late under readiness", run('policy.kind="readiness"', 'policy.on_late="partial"'),
         "policy.on_late", INERT, "policy.kind = 'readiness'"),
    case("deadline under wait_all", run("policy.deadline=30.0"), "policy.deadline", INERT),
    case("deadline under readiness", run('policy.kind="readiness"', "policy.deadline=30.0"),
         "policy.deadline", INERT),
    case("readiness under a deadline", run(*POLICY, "policy.readiness=0.3"), "policy.readiness",
         INERT, "policy.kind = 'readiness'"),
    case("device_level without a sampler", run('system.device_level="bogus"'),
         "system.device_level", INERT, "system.device_sampler is not 'random'"),
    case("state_level without a sampler", run('system.state_level="severe"'),
         "system.state_level", INERT),
    case("min_interval with bernoulli availability",
         run('system.availability="bernoulli"', "system.min_interval=60.0"),
         "system.min_interval", INERT, "system.availability = 'bernoulli'"),
    case("min_interval with always-ready devices", run("system.min_interval=60.0"),
         "system.min_interval", INERT),
    case("availability_p with always-ready devices", run("system.availability_p=0.3"),
         "system.availability_p", INERT),
    case("availability_slots with the FLASH traces",
         run('system.availability="strict"', "system.availability_slots=12"),
         "system.availability_slots", INERT),
    case("step_time_sigma with uniform devices", run("system.step_time_sigma=0.3"),
         "system.step_time_sigma", INERT),
    case("bandwidth with the FLASH networks",
         run('system.network="flash"', "system.bandwidth=1e6"), "system.bandwidth", INERT),
    case("a deadline policy on the async server", small(*ASYNC, *POLICY), "policy.kind", INERT,
         "server.mode = 'sync'"),
    case("over_commit on the async server", small(*ASYNC, "policy.over_commit=0.5"),
         "policy.over_commit", INERT, "server.mode = 'sync'"),
    case("server.max_staleness in sync mode", run(*POLICY, "server.max_staleness=3"),
         "server.max_staleness", INERT, "server.mode = 'async'"),
    case("server.buffer_size in sync mode", run('server.mode="sync"', "server.buffer_size=5"),
         "server.buffer_size", INERT),
    case("compression.fraction with qsgd",
         run('compression.upload="qsgd"', "compression.fraction=0.1"),
         "compression.fraction", INERT, "one of 'top_k', 'random_k'"),
    case("compression.levels with top_k",
         run('compression.upload="top_k"', "compression.levels=4"), "compression.levels", INERT),
    case("compression.error_feedback with nothing to compress",
         run("compression.error_feedback=true"), "compression.error_feedback", INERT),
    case("privacy.clip_lr without adaptive clipping", run("privacy.clip_lr=0.1"),
         "privacy.clip_lr", INERT, "privacy.adaptive = true", "privacy.adaptive = false"),
    case("an Arabic-Indic digit in a trace CSV",
         small('system.availability="{tmp}/trace.csv"'), "line 3, column 'end_s'",
         "'\u0663' is not a finite number", prepare=csv_trace),
]

# Item 3: messages that named internals or misled.
MESSAGE_CASES = [
    case("adaptive clipping at the default noise", run("privacy.adaptive=true"),
         "privacy.adaptive = true needs privacy.noise_multiplier below", "privacy.count_noise"),
    case("gandalf tau not a number", run(GANDALF, 'algorithm.tau="abc"'),
         "algorithm.tau must be a number, got 'abc'"),
    case("gandalf gan_hidden not a list", run(GANDALF, "algorithm.gan_hidden=5"),
         "algorithm.gan_hidden must be a list, got 5"),
    case("--set with an empty key part", run("data..name=x"), "'data..name' is not a key"),
    case("--set with a trailing dot", run("data.=x"), "'data.' is not a key"),
    case("feature_skew options without a kind", run("feature_skew.sigma=0.1"),
         "feature_skew.kind is required here"),
    case("a deadline beyond float32", run(*POLICY, "policy.deadline=1e300"),
         "policy.deadline = 1e+300 is not finite in float32"),
    # Item 8.
    case("ditto compressed", small('algorithm.name="ditto"', 'compression.upload="float16"'),
         "[compression] does not apply to algorithm.name = 'ditto'"),
    case("ditto made private", small('algorithm.name="ditto"', "privacy.noise_multiplier=0.5"),
         "[privacy] does not apply to algorithm.name = 'ditto'"),
]


@pytest.mark.parametrize("c", SIZE_CASES)
def test_every_size_is_priced_before_a_directory(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


@pytest.mark.parametrize("c", SILENT_CASES)
def test_a_key_that_does_nothing_is_refused(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


@pytest.mark.parametrize("c", MESSAGE_CASES)
def test_messages_name_the_key_not_the_internals(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


def test_a_size_is_priced_against_the_memory_there_is():
    """Below int32, a size is refused by its bytes: the same config fits a large device and not
    a small one (``free_bytes`` stands for the device), and the bound grows with the size."""
    from fedjax_het.training import sizes

    raw = config.load(None, [*SMALL, 'system.availability="bernoulli"',
                             "system.availability_slots=100000"])
    experiment = config.build(raw)
    parts = (experiment.config, experiment.data, experiment.model, experiment.work, 3)
    priced = {s.key: s for s in sizes.sizes(*parts)}
    slots = priced["system.availability_slots"]
    assert slots.count == 6 * 100_000 and slots.bytes == 6 * 100_000 * sizes.SLOT_BYTES
    sizes.check(*parts, free_bytes=10**12)
    with pytest.raises(config.ConfigError, match=r"system.availability_slots = 100000 makes a "
                       r"Bernoulli trace of at least .* which does not fit the device"):
        sizes.check(*parts, free_bytes=slots.bytes)


def test_every_rule_names_a_key_and_a_chooser_the_config_has():
    """The rules of ``config.APPLIES`` are not vacuous: each key and each chooser is a key of
    the schema (a renamed option would otherwise leave its rule checking nothing)."""
    from fedjax_het.schema import When

    known = config.options(config.load(None, POLICY))
    for key, conditions in config.APPLIES.items():
        assert key in known, key
        for when in conditions:
            assert isinstance(when, When) and when.chooser in known, (key, when.chooser)


def test_a_key_at_its_default_asks_for_nothing(capsys):
    """A resolved config lists every key of its tables (``config --all``, a run's config.toml):
    those at their defaults pass where they do nothing."""
    sets = ['policy.kind="wait_all"', "policy.deadline=120.0", 'policy.on_late="drop"',
            "system.min_interval=0.0"]
    assert cli.main(["config", *_sets(sets)]) == 0
    assert "deadline = 120.0" in capsys.readouterr().out


def test_a_key_where_it_applies_is_still_accepted(capsys):
    """The same keys where their choosers let them act: nothing refused."""
    sets = [*POLICY, "policy.deadline=30.0", 'policy.on_late="partial"',
            'system.availability="bernoulli"', "system.availability_slots=12",
            'compression.upload="top_k"', "compression.fraction=0.1"]
    assert cli.main(["config", *_sets(sets)]) == 0
    printed = capsys.readouterr().out
    assert "on_late = \"partial\"" in printed and "availability_slots = 12" in printed


class _Interrupting(importlib.abc.MetaPathFinder):
    """Ctrl-C arriving while ``fedjax_het.front.cli`` is imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "fedjax_het.front.cli":
            raise KeyboardInterrupt


def test_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    import fedjax_het.front
    from fedjax_het.front import entry

    monkeypatch.delitem(sys.modules, "fedjax_het.front.cli")
    monkeypatch.delattr(fedjax_het.front, "cli")
    monkeypatch.setattr(sys, "meta_path", [_Interrupting(), *sys.meta_path])
    assert entry.main(["config"]) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("fedjax-het: interrupted while starting (importing JAX); nothing "
                            "was run\n")


def test_the_command_entry_imports_no_jax():
    """What makes Ctrl-C during the import catchable: the entry module (and the package root
    it imports) come before JAX."""
    import subprocess

    code = "import sys, fedjax_het.front.entry; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_rounded_chunk_says_so_in_the_plan_line():
    """``engine.chunk = 3`` of a cohort of 10 runs as chunk 2 (chunks are powers of two); the
    plan's line says so, and an exact chunk says nothing more."""
    from fedjax_het import models
    from fedjax_het.algorithms import fedavg
    from fedjax_het.data import LocalWork
    from fedjax_het.engine.local import LocalSpec

    model, algorithm = models.logistic_regression((5,), 3), fedavg()
    spec = LocalSpec(model, algorithm, LocalWork(batch_size=4), max_steps=2, max_count=8)
    train = memory.abstract_split(rows=64, example=(5,), num_clients=10)
    plan = lambda chunk: memory.plan_chunk(
        spec, algorithm.hyper(), train, num_clients=10, cohort=10, chunk=chunk,
        free_bytes=10**9, source="analytic",
    )
    rounded = plan(3)
    assert rounded.chunk == 2
    assert "chunk 2 of 10 (engine.chunk = 3 rounded to a power of two" in rounded.describe()
    assert "rounded" not in plan(2).describe() and "rounded" not in plan(10).describe()


# Item 8: data.name = "tfds" from a config, without the network.
TFDS = ('data.name="tfds"', 'data.dataset="fake_digits"', 'data.train_split="train[:80%]"',
        "data.num_clients=4", "sampler.clients_per_round=2", 'model.name="logistic_regression"')


def _fake_split(rows: int, classes: int = 3) -> tfds_loader.ImageSplit:
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 2, 2, 1) / (rows * 4)
    return tfds_loader.ImageSplit(x, (np.arange(rows) % classes).astype(np.int32), classes)


def test_tfds_builds_from_a_config_with_its_options(monkeypatch, capsys):
    """The config reaches the loader with its dataset, splits and keys, reading offline; the
    experiment is built from what the loader returned."""
    calls = []

    def load_split(name, split, *, num_examples, data_dir, download, image_key, label_key):
        calls.append((name, split, num_examples, data_dir, download, image_key, label_key))
        return _fake_split(40 if split.startswith("train") else 12)

    monkeypatch.setattr(tfds_loader, "load_split", load_split)
    experiment = config.build(config.load(None, [*TFDS, "data.num_test=12",
                                                 'data.label_key="digit"']))
    assert calls == [("fake_digits", "train[:80%]", None, None, False, "image", "digit"),
                     ("fake_digits", "test", 12, None, False, "image", "digit")]
    assert experiment.data.num_clients == 4 and experiment.data.example_shape == (2, 2, 1)
    assert int(experiment.data.train.count.sum()) == 40
    assert experiment.config["data"]["dataset"] == "fake_digits"
    assert cli.main(["config", *_sets(TFDS)]) == 0
    assert 'dataset = "fake_digits"' in capsys.readouterr().out


def _missing_tfds():
    raise ImportError("loading TFDS datasets needs tensorflow-datasets, an optional extra: "
                      'pip install "fedjax_het[tfds]"')


def test_tfds_without_tensorflow_datasets_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tfds_loader, "_import_tfds", _missing_tfds)
    c = case("no tensorflow-datasets", run(*TFDS), "data.dataset = 'fake_digits'",
             "needs tensorflow-datasets").values[0]
    _check_refused(c, tmp_path, capsys)


def test_tfds_not_prepared_offline_is_one_line(monkeypatch, tmp_path, capsys):
    """TFDS's own errors span many lines (a list of every dataset it knows); one is kept."""

    class DatasetNotFoundError(ValueError):
        pass

    class Fake:
        @staticmethod
        def data_source(name, **kwargs):
            raise DatasetNotFoundError(f"Dataset {name} not found.\nAvailable datasets:\n\t- a")

    monkeypatch.setattr(tfds_loader, "_import_tfds", lambda: Fake)
    c = case("not prepared", run(*TFDS, f'data.data_dir="{tmp_path}"'),
             f"cannot be read offline from {tmp_path}", "Dataset fake_digits not found.").values[0]
    _check_refused(c, tmp_path, capsys)


def test_tfds_dataset_is_required():
    with pytest.raises(config.ConfigError, match="data.dataset is required here"):
        config.build(config.load(None, ['data.name="tfds"']))
    assert "data.dataset" in config.options(config.load(None, ['data.name="tfds"']))
    assert catalog.DATASETS["tfds"] is catalog.tfds_images
