"""``engine.matmul_precision`` and ``engine.compile_cache`` (``fedjax_het.training.compilation``).

Precision: what reaches the compiled programs is checked in the StableHLO that a run
lowers (``jax_dump_ir_to``): every ``dot_general`` of the training block and of the
evaluation carries the requested precision (``precision = [HIGHEST, HIGHEST]``), so
that an option that was validated but not applied while tracing fails here.

Cache: two fresh processes run the same tiny config on one cache folder; the
second loads every program and writes nothing (the folder is unchanged), and
computes what the first computed. The suite's cache is a temporary folder
(``tests/conftest.py``); these tests give each process a folder of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.front import cli
from fedjax_het.front import config as config_lib
from fedjax_het.front.sweep import sweep
from fedjax_het.training import compilation, simulate

TINY = ['data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3",
        "model.name=mlp", "model.hidden=[8]", "rounds=2", "eval_every=1", "engine.devices=1"]
PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")


def _experiment(*overrides: str) -> config_lib.Experiment:
    return config_lib.build(config_lib.load(None, [*TINY, *overrides]))


def _dumped(tmp_path: Path, fn) -> dict[str, set[tuple[str, str]]]:
    """The precisions of every ``dot_general`` in each StableHLO module ``fn()`` lowers,
    by module file name (modules without products left out)."""
    where = tmp_path / "ir"
    jax.config.update("jax_dump_ir_to", str(where))
    try:
        fn()
    finally:
        jax.config.update("jax_dump_ir_to", "")
    found = {}
    for path in sorted(where.glob("*.mlir")):
        text = path.read_text()
        dots = text.count("stablehlo.dot_general")
        if dots:
            attrs = PRECISION.findall(text)
            assert len(attrs) == dots, f"{path.name}: a dot_general without a precision"
            found[path.name] = set(attrs)
    return found


# --- matmul_precision ------------------------------------------------------------------------


def test_defaults_are_float32_products_and_the_cache_on():
    assert config_lib.DEFAULTS["engine"]["matmul_precision"] == "highest"
    assert config_lib.DEFAULTS["engine"]["compile_cache"] is True
    kwargs = _experiment().run_kwargs()
    assert (kwargs["matmul_precision"], kwargs["compile_cache"]) == ("highest", True)
    kwargs = _experiment('engine.matmul_precision="default"', "engine.compile_cache=false")
    assert kwargs.run_kwargs()["matmul_precision"] == "default"
    assert kwargs.run_kwargs()["compile_cache"] is False


@pytest.mark.parametrize("asked, attribute", [
    ("highest", "HIGHEST"), ("high", "HIGH"), ("default", "DEFAULT"),
])
def test_run_compiles_its_block_and_evaluation_at_the_requested_precision(
    asked, attribute, tmp_path
):
    exp = _experiment(f'engine.matmul_precision="{asked}"')
    histories = []
    found = _dumped(tmp_path, lambda: histories.append(simulate.run(
        exp.data,
        *exp.options(progress=False),
    )))
    names = " ".join(found)
    assert "run_block" in names and "evaluate" in names, found
    assert set().union(*found.values()) == {(attribute, attribute)}, found
    assert histories[0].summary["matmul_precision"] == asked


def test_sweep_compiles_its_programs_at_the_requested_precision(tmp_path):
    exp = _experiment()
    kwargs = {k: v for k, v in exp.run_kwargs().items()
              if k not in ("seed", "hyper", "system", "select", "matmul_precision")}
    histories = []
    found = _dumped(tmp_path, lambda: histories.extend(sweep(
        exp.data, exp.model, exp.algorithm, exp.sampler, seeds=(0, 1), progress=False,
        matmul_precision="high", **kwargs)))
    assert "run_block" in " ".join(found), found
    assert set().union(*found.values()) == {("HIGH", "HIGH")}, found
    assert [h.summary["matmul_precision"] for h in histories] == ["high", "high"]


def test_the_precision_is_a_context_only_while_the_run_lasts():
    exp = _experiment()
    simulate.run(
        exp.data,
        *exp.options(progress=False),
    )
    assert jax.config.jax_default_matmul_precision is None


def test_on_cpu_the_three_precisions_are_the_same_arithmetic():
    """The config's claim: XLA:CPU computes float32 products alike at every precision."""
    key = jax.random.key(0)
    a, b = jax.random.normal(key, (64, 96)), jax.random.normal(jax.random.key(1), (96, 32))
    images = jax.random.normal(key, (4, 28, 28, 1))
    kernel = jax.random.normal(jax.random.key(2), (5, 5, 1, 8))

    def products(a, b, images, kernel):
        conv = jax.lax.conv_general_dilated(images, kernel, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.tanh(a @ b), conv

    outputs = {}
    for precision in compilation.MATMUL_PRECISIONS:
        with jax.default_matmul_precision(precision):
            outputs[precision] = jax.jit(products)(a, b, images, kernel)
    for precision in ("high", "default"):
        for got, want in zip(outputs[precision], outputs["highest"]):
            np.testing.assert_array_equal(got, want)


def test_a_run_at_default_precision_matches_highest_bit_for_bit_on_cpu():
    exp = _experiment()
    runs = [
        simulate.run(
            exp.data,
            *exp.options(**{**exp.run_kwargs(), "matmul_precision": p}, progress=False),
        )
        for p in ("highest", "default")
    ]
    for got, want in zip(jax.tree.leaves(runs[1].params), jax.tree.leaves(runs[0].params)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("override, message", [
    ('engine.matmul_precision="tf32"',
     "engine.matmul_precision must be one of 'default', 'high', 'highest', got 'tf32'"),
    ("engine.matmul_precision=1", "engine.matmul_precision must be a string, got 1"),
    ('engine.compile_cache="yes"', "engine.compile_cache must be true or false, got 'yes'"),
])
def test_bad_values_are_one_config_line(override, message, tmp_path, capsys):
    argv = ["run", *[a for s in [*TINY, override] for a in ("--set", s)],
            "--out", str(tmp_path / "out"), "--no-progress"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"fedjax-het: config error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_the_python_api_refuses_an_unknown_precision_before_running():
    exp = _experiment()
    with pytest.raises(ValueError, match="matmul_precision must be one of 'default', 'high', "
                                         "'highest', got 'bfloat16'"):
        simulate.run(
            exp.data,
            *exp.options(**{**exp.run_kwargs(), "matmul_precision": "bfloat16"}, progress=False),
        )


# --- compile_cache ---------------------------------------------------------------------------


def test_the_cache_folder_follows_the_documented_order(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path / "mine"))
    with _jax_cache_dir(str(tmp_path / "jax")):
        assert compilation.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("FEDJAX_HET_CACHE_DIR")
    monkeypatch.setattr(compilation, "_state", {})  # nothing set by fedjax_het yet
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with _jax_cache_dir(str(tmp_path / "jax")):  # JAX_COMPILATION_CACHE_DIR, say
        assert compilation.cache_dir() == tmp_path / "jax"
    with _jax_cache_dir(None):
        assert compilation.cache_dir() == tmp_path / "xdg" / "fedjax_het" / "xla"
        monkeypatch.delenv("XDG_CACHE_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        assert compilation.cache_dir() == tmp_path / "home" / ".cache" / "fedjax_het" / "xla"


class _jax_cache_dir:
    """JAX's own cache folder set for a while (as ``JAX_COMPILATION_CACHE_DIR`` sets it)."""

    def __init__(self, path: str | None):
        self.path = path

    def __enter__(self):
        self.before = jax.config.jax_compilation_cache_dir
        jax.config.update("jax_compilation_cache_dir", self.path)

    def __exit__(self, *exc):
        jax.config.update("jax_compilation_cache_dir", self.before)


def _cli_run(tmp_path: Path, name: str, cache: Path, *overrides: str) -> dict:
    """``fedjax-het run`` of TINY in a fresh process; its summary."""
    out = tmp_path / name
    sets = [a for s in [*TINY, *overrides] for a in ("--set", s)]
    env = {**os.environ, "FEDJAX_HET_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "fedjax_het.front.cli", "run", *sets, "--out", str(out),
         "--no-progress"], env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((out / "summary.json").read_text())


def _listing(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir()}


@pytest.mark.slow
def test_a_second_process_compiles_nothing_the_first_compiled(tmp_path):
    cache = tmp_path / "xla"
    first = _cli_run(tmp_path, "first", cache)["compile_cache"]
    written = _listing(cache)
    # An empty cache: every program is written once; a hit in the first run is a program the
    # run compiled twice (the chunk plan compiles the chunk program to read its memory).
    assert first["dir"] == str(cache) and first["written"] >= 2
    assert first["written"] + first["hits"] == first["programs"]
    assert len(written) >= first["written"]  # the run's programs, and the set-up's
    second = _cli_run(tmp_path, "second", cache)["compile_cache"]
    assert second["hits"] == second["programs"] == first["programs"]  # loaded, every one
    assert second["written"] == 0
    assert _listing(cache) == written  # not one new entry
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    lines = [
        [{k: v for k, v in json.loads(line).items() if k != "wall_s"}
         for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("first", "second")
    ]
    assert lines[0] == lines[1]  # the loaded programs compute what the compiled ones did


@pytest.mark.slow
def test_compile_cache_false_writes_nothing(tmp_path):
    cache = tmp_path / "xla"
    summary = _cli_run(tmp_path, "off", cache, "engine.compile_cache=false")
    assert summary["compile_cache"]["dir"] is None
    assert summary["compile_cache"]["written"] == summary["compile_cache"]["hits"] == 0
    assert summary["compile_cache"]["programs"] >= 2
    assert not cache.exists()


def test_configure_turns_the_cache_on_and_off_in_one_process(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path / "xla"))
    try:
        assert compilation.configure(True) == str(tmp_path / "xla")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
        assert jax.config.jax_enable_compilation_cache
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(5.0)).block_until_ready()
        entries = _listing(tmp_path / "xla")
        assert entries  # even this small, quick program
        assert compilation.configure(False) is None
        assert not jax.config.jax_enable_compilation_cache
        jax.jit(lambda x: x * 5 - 2)(jnp.arange(7.0)).block_until_ready()
        assert _listing(tmp_path / "xla") == entries
    finally:
        monkeypatch.undo()
        compilation.configure(True)  # the session's folder again (tests/conftest.py)


def test_a_folder_that_cannot_be_made_turns_the_cache_off_with_a_warning(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FEDJAX_HET_CACHE_DIR", str(tmp_path / "file" / "xla"))
    try:
        with pytest.warns(UserWarning, match="compilation cache off: cannot create its folder"):
            assert compilation.configure(True) is None
        assert not jax.config.jax_enable_compilation_cache
    finally:
        monkeypatch.undo()
        compilation.configure(True)
