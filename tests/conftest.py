"""Strict test settings, applied before JAX starts (STYLE.md habit 9, after Equinox's conftest).

- Four fake CPU devices (``--xla_force_host_platform_device_count=4``), so
  multi-device code runs on every test run. The flag must be in ``XLA_FLAGS``
  before the first JAX backend starts; it is added only when the caller has
  not already chosen a device count.
- Rank promotion raises: ``[n] + [n, 1]`` broadcasting by accident is an error,
  not a silent ``[n, n]``.

Warnings are errors through ``filterwarnings = error`` in ``pyproject.toml``.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count"

if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}=4".strip()

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
