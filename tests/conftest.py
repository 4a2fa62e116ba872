"""Strict test settings, applied before JAX starts (STYLE.md habit 9, after Equinox's conftest).

- Four fake CPU devices (``--xla_force_host_platform_device_count=4``), so
  multi-device code runs on every test run. The flag must be in ``XLA_FLAGS``
  before the first JAX backend starts; it is added only when the caller has
  not already chosen a device count.
- Rank promotion raises: ``[n] + [n, 1]`` broadcasting by accident is an error,
  not a silent ``[n, n]``.
- The persistent compilation cache is a temporary folder of the session
  (``FEDJAX_HET_CACHE_DIR``), so that no test writes to ``~/.cache/fedjax_het``.
- Compiled programs are released (``jax.clear_caches``) after each test module, and after any
  test that leaves the process holding over a third of the kernel's memory mappings. Every
  program XLA:CPU keeps holds about three mappings of its machine code; a worker that runs a
  thousand tests kept tens of thousands, and at the kernel's limit (``vm.max_map_count``,
  65,530 by default) the next compilation crashed the process (a segfault or abort inside
  ``backend_compile_and_load``, in whichever test compiled next; reproduced by lowering the
  limit to 3,000).

Each pytest-xdist worker (``make test`` runs ``pytest -n auto``) is a process of its own that
runs this file: it gets the four devices and a cache folder of its own. Tests that need files
or ports take them from ``tmp_path`` or the system (port 0), so workers never share either.

Warnings are errors through ``filterwarnings = error`` in ``pyproject.toml``.
"""

import atexit
import gc
import os
import shutil
import tempfile

_DEVICE_FLAG = "--xla_force_host_platform_device_count"

if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}=4".strip()

# The persistent compilation cache (fedjax_het.training.compilation) of every run in the session, and
# of the commands tests start in subprocesses: a folder of its own, removed at the end; never
# the user's ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="fedjax_het-test-xla-")
os.environ["FEDJAX_HET_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


def _release() -> None:
    jax.clear_caches()
    gc.collect()


def _mappings_near_limit() -> bool:
    try:
        with open("/proc/self/maps", "rb") as maps, open("/proc/sys/vm/max_map_count") as limit:
            return sum(1 for _ in maps) > int(limit.read()) // 3
    except OSError:  # not Linux
        return False


@pytest.fixture(autouse=True, scope="module")
def _release_after_module():
    """Drops the programs JAX keeps compiled after each module (module docstring)."""
    yield
    _release()


@pytest.fixture(autouse=True)
def _release_near_the_mapping_limit():
    """Drops them after a test that leaves the process near the mapping limit."""
    yield
    if _mappings_near_limit():
        _release()
