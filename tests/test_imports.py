"""Every module of the package imports, and every package folder is installed (docs/design.md §2)."""

import importlib
import pkgutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import fedjax_het

ROOT = Path(__file__).resolve().parents[1]


def all_modules() -> list[str]:
    """Every module under fedjax_het, including the mapped algorithms/ and sampling/ folders."""
    roots = [fedjax_het]
    roots += [importlib.import_module(f"fedjax_het.{name}") for name in ("algorithms", "sampling")]
    return sorted(
        {
            info.name
            for root in roots
            for info in pkgutil.walk_packages(root.__path__, prefix=f"{root.__name__}.")
        }
    )


def test_every_module_imports():
    modules = all_modules()
    assert "fedjax_het.algorithms.fedavg" in modules
    assert "fedjax_het.sampling.uniform" in modules
    for name in modules:
        importlib.import_module(name)


def test_every_source_package_is_listed_in_pyproject():
    """A new subpackage must be added to pyproject's explicit package list, or wheels lose it.

    Data folders (``assets``) are listed too, as namespace packages holding package data."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    mapped = {"fedjax_het.algorithms": ROOT / "algorithms", "fedjax_het.sampling": ROOT / "sampling"}
    found = set(mapped)
    for init in (ROOT / "fedjax_het").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for assets in (ROOT / "fedjax_het").rglob("assets"):
        found.add(".".join(assets.relative_to(ROOT).parts))
    assert found == listed


def test_no_bare_top_level_algorithms_or_sampling(tmp_path):
    """Outside the source tree, only the fedjax_het namespace is importable."""
    probe = "import importlib.util as u; print([u.find_spec(n) is None for n in ('algorithms', 'sampling')])"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[True, True]"


def test_importing_every_module_starts_no_jax_backend():
    """``jax.distributed.initialize`` must come before any backend starts (the CLI calls it
    after importing the config): no module may build an array when it is imported."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    code = "\n".join([
        "import importlib, jax",
        *(f"importlib.import_module({name!r})" for name in all_modules()),
        f"jax.distributed.initialize('localhost:{port}', num_processes=1, process_id=0)",
        "jax.distributed.shutdown()",
    ])  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
