"""The config's [model] table: a model of ``models.ZOO`` and its factory's options.

The factory's example shape and class count come from the data, so the options are checked
first (``model_options``) and the model is built once the data is (``build_model``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fedjax_het import models
from fedjax_het.schema import (
    ConfigError,
    Key,
    arguments,
    choose,
    guarded,
    resolved,
    signature_keys,
)

DEFAULTS: dict[str, Any] = {"model": {"name": "mlp", "hidden": [200, 200]}}
SKIP = ("example_shape", "num_classes", "conv")  # given by the data; conv: engine.conv


TABLES: dict[str, str] = {"model": "the model and its options (fedjax_het.models.ZOO)"}
"""What the table of this module configures, for ``fedjax-het config --all``."""


def keys(config: Mapping[str, Any]) -> dict[str, Key]:
    """The keys of [model] as ``config`` chooses it (``model.name``)."""
    out: dict[str, Key] = {}
    if config.get("model"):
        doc = "the model; each takes its own options (fedjax-het explain model.<option>)"
        out["model.name"] = Key(str, DEFAULTS["model"]["name"], doc, choices=tuple(models.ZOO))
    out.update(signature_keys("model", _factory(config), SKIP))
    return out


def _factory(config: Mapping[str, Any]) -> Callable[..., models.Model]:
    return choose("model.name", config["model"].get("name"), models.ZOO)


def model_options(config: dict[str, Any]) -> tuple[Callable[..., models.Model], dict[str, Any]]:
    """The model's factory and its checked options; [model] resolved in place."""
    table = {k: v for k, v in config["model"].items() if k != "name"}
    factory = _factory(config)
    args = arguments("model", factory, table, SKIP)
    config["model"] = {"name": config["model"]["name"], **resolved(args, factory, SKIP)}
    return factory, args


def build_model(
    factory: Callable[..., models.Model],
    args: Mapping[str, Any],
    example_shape: Sequence[int],
    num_classes: int,
    x: np.ndarray,
    y: np.ndarray,
) -> models.Model:
    """The model for the data's ``example_shape`` and ``num_classes``, whose outputs
    ``[batch, *label_shape, classes]`` fit the labels ``y`` (one line if not)."""
    model = guarded("model", lambda: factory(example_shape, num_classes, **args))
    params = jax.eval_shape(model.init, jax.random.key(0))
    outputs = jax.eval_shape(
        lambda p: model.apply(p, x[:1], train=False, key=None), params
    ).shape
    if tuple(outputs[1:-1]) != tuple(y.shape[1:]):
        hint = " (char models: model.every_position = true)" if y.ndim > 1 else ""
        raise ConfigError(
            f"model {model.name} gives outputs of shape {list(outputs[1:])} per example but the "
            f"data's labels have shape {list(y.shape[1:])} per example{hint}; they must agree "
            f"but for the last (class) axis"
        )
    return model
