"""The documents in docs/ stay current with the code.

- docs/design.md's import diagram is what ``docs/make_diagram.py`` writes from the code
  now: a module added or an import changed without regenerating it fails here.
- Every ``fedjax_het`` name in backticks in docs/*.md (``fedjax_het.engine.cohort.StateTable``)
  imports and resolves, and every repository path in backticks
  (``fedjax_het/engine/cohort.py``, ``algorithms/fedavg.py``) exists.
- docs/algorithms.md's worked example runs: its ``python`` blocks, in order, define an
  algorithm in under 50 lines, register it and train 3 rounds; one FedExP round then moves
  the model ``eta >= 1`` times as far as a FedAvg round from the same start.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from pathlib import Path

import jax
import numpy as np
import pytest

import fedjax_het
from fedjax_het import models, registry, rng
from fedjax_het.algorithms import fedavg
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform
from fedjax_het.training.options import run_options

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PATH_ROOTS = ("fedjax_het/", "algorithms/", "sampling/", "tests/", "experiments/", "docs/")


def make_diagram():
    """docs/make_diagram.py as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_diagram", DOCS / "make_diagram.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_design_diagram_is_current():
    diagram = make_diagram()
    block = diagram.current_block((DOCS / "design.md").read_text())
    assert block is not None, "docs/design.md has lost its diagram markers"
    assert block == diagram.render(), (
        "docs/design.md's import diagram is stale: run `python docs/make_diagram.py`"
    )


def test_diagram_places_every_module():
    diagram = make_diagram()
    found = diagram.modules()
    assert "fedjax_het.engine.cohort" in found and "fedjax_het.algorithms.fedavg" in found
    unplaced = sorted(n for n in found if diagram.group_of(n) == diagram.UNPLACED[0])
    assert not unplaced, f"place these modules in docs/make_diagram.py's GROUPS: {unplaced}"


def backticked(text: str) -> list[str]:
    """The spans in single backticks outside fenced code blocks."""
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.findall(r"`([^`\n]+)`", prose)


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a ``fedjax_het`` module, or an attribute path inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            fields = (
                {f.name for f in dataclasses.fields(target)}
                if (isinstance(target, type) and dataclasses.is_dataclass(target))
                else set()
            )
            if hasattr(target, name):
                target = getattr(target, name)
            elif name in fields:
                target = None  # a field without a class-level default: nothing to follow
            else:
                return False
        return True
    return False


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_names_and_paths_in_docs_exist(page):
    spans = backticked((DOCS / page).read_text())
    names = [s for s in spans if re.fullmatch(r"fedjax_het(\.\w+)*", s)]
    paths = [s for s in spans if s.startswith(PATH_ROOTS) and re.fullmatch(r"[\w./-]+", s)]
    assert names or paths
    missing = [n for n in names if not resolves(n)] + [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/{page} names what does not exist: {missing}"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by the test vanish after it (other tests list the registry)."""
    monkeypatch.setattr(
        registry, "_registered", {kind: dict(names) for kind, names in registry._registered.items()}
    )


def one_round(algorithm, data, hyper=None):
    return fedjax_het.run(
        data,
        *run_options(
            model=models.logistic_regression(data.example_shape, data.num_classes),
            algorithm=algorithm,
            sampler=uniform(num_clients=data.num_clients, cohort_size=5),
            rounds=1,
            hyper=hyper,
            work=fedjax_het.LocalWork(batch_size=10, epochs=1),
            weighting="uniform",
            eval_every=1,
            progress=False,
            devices=1,
        ),
    ).params


def test_algorithms_example_runs(scratch_registry, capsys):
    blocks = python_blocks((DOCS / "algorithms.md").read_text())
    assert len(blocks) == 2
    assert len(blocks[0].splitlines()) < 50, "the worked example promises under 50 lines"
    namespace = {"__name__": "docs_algorithms_md"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/algorithms.md block {i + 1}", "exec"), namespace)  # noqa: S102
    history = namespace["history"]
    assert [m["round"] for m in history.metrics] == [0, 3]
    assert history.metrics[-1]["test_accuracy"] > history.metrics[0]["test_accuracy"]
    assert "fedexp" in registry.names("algorithm")
    assert "[0, 3]" in capsys.readouterr().out

    # One round of each from the same start, clients and batches (keys are fold_in(seed,
    # round, client)): FedExP's step is FedAvg's (server SGD at rate 1) times eta >= 1.
    data = leaf_synthetic(num_clients=20, alpha=0.5, beta=0.5)
    model = models.logistic_regression(data.example_shape, data.num_classes)
    start = model.init(rng.stream(rng.seed_key(0), "init"))
    exp = one_round(registry.lookup("algorithm", "fedexp")(client_lr=0.1), data)
    avg = one_round(fedavg(), data, hyper={"client_lr": 0.1})
    flat = lambda params: np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)])
    exp_step, avg_step = flat(start) - flat(exp), flat(start) - flat(avg)
    eta = float(exp_step @ avg_step / (avg_step @ avg_step))
    assert eta >= 1 - 1e-5
    np.testing.assert_allclose(exp_step, eta * avg_step, rtol=1e-4, atol=1e-6)
