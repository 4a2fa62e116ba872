"""FedAvg on width sub-models: the algorithm FjORD, HeteroFL and FedRolex share.

Each client ``k`` has a width level (an index of the widths, widest first) fixed for the run;
its sub-model is the window of its width's units (``algorithms/submodels.py``: masks, their
costs on the simulated schedule, and the dense sub-model's params). The server averages
each parameter over the clients that trained it (``masked_mean``). Where each client trains
one width for the round (HeteroFL, FedRolex) the engine may run each level's clients as a
smaller dense program (``dense_client``, ``engine.groups``) instead of masks on the full
model: the same results within float rounding, at about the work the widths do.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState as ModelState
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.submodels import (
    check_widths,
    put_units,
    take_units,
    unit_layout,
    width_costs,
    width_mask,
)
from fedjax_het.engine.algorithm import FederatedAlgorithm, LocalContext, masked_mean
from fedjax_het.engine.hooks import ClientCosts, DenseLevels, PayloadBytes, SubModel
from fedjax_het.engine.local import LocalSpec, local_update
from fedjax_het.models import Model
from fedjax_het.transforms.compression import bytes_sent, identity
from fedjax_het.typing import ClientState, Hyper, Params, PRNGKey, PyTree


@struct.dataclass
class WidthState:
    """The server's model and optimizer state, each client's width level ``[N]`` (int32, an
    index into the widths) and the rounds done (FedRolex's window offset)."""

    model: ModelState
    levels: jax.Array
    round: jax.Array


@struct.dataclass
class WidthPayload:
    """What a client downloads: the full model, the width levels ``[N]`` and the round."""

    params: Params
    levels: jax.Array
    round: jax.Array


def _start(model: Model, payload: WidthPayload, client_state: ClientState, batches, hyper: Hyper,
           key: PRNGKey) -> tuple[Params, ClientState]:
    del model, batches, hyper, key
    return payload.params, client_state


def _payload(broadcast) -> tuple[float, float]:
    """Full-width bytes both ways; each client pays its ``ClientCosts.transfer`` share."""
    full = float(bytes_sent(identity(), getattr(broadcast, "params", broadcast)))
    return full, full


def check_levels(client_levels: tuple[int, ...], widths: tuple[float, ...]) -> tuple[int, ...]:
    """``client_levels`` as ints if each indexes ``widths``; else a one-line ValueError."""
    levels = tuple(int(level) for level in client_levels)
    bad = [level for level in levels if not 0 <= level < len(widths)]
    if bad:
        raise ValueError(f"client_levels: level {bad[0]} is not an index of the "
                         f"{len(widths)} widths")
    return levels


def _dense_levels(widths: tuple[float, ...], rolling: bool, scaler: bool) -> DenseLevels:
    """Each client's level from the payload; its round on the level's dense sub-model."""
    return DenseLevels(len(widths), lambda payload, ids: payload.levels[ids], functools.partial(
        dense_client, widths=widths, rolling=rolling, scaler=scaler))


def dense_client(level: int, spec: LocalSpec, hyper: Hyper, payload: WidthPayload, data, *,
                 widths: tuple[float, ...], rolling: bool, scaler: bool):
    """One client's round at width level ``level`` on the dense sub-model, and the widening of
    its sums (``DenseLevels``): the model cut by ``Model.at_width``, the params' kept units
    (``take_units``; FedRolex's window rolled to the front), the scaler as ``1 / p`` on
    every kept fan-in row; the client reports the level's mask as trained, and the level's
    sums go back to the full shapes by ``put_units``."""
    model, x = spec.model, data.x[:1]
    layout = unit_layout(model, payload.params, x, widths)
    offset = payload.round if rolling else 0
    small = model.at_width(widths[level])
    params = take_units(layout, payload.params, level, offset)
    built = jax.eval_shape(small.init, jax.random.key(0))
    if jax.tree.structure(built) != layout.treedef or any(
            a.shape != b.shape for a, b in zip(jax.tree.leaves(built), jax.tree.leaves(params))):
        raise ValueError(f"model {model.name}: at_width({widths[level]:g}) does not build the "
                         "params its kept units make (see Model.at_width)")
    factors = None
    if scaler and widths[level] < 1:
        factors = jax.tree.unflatten(layout.treedef, [
            jnp.float32(1.0 / widths[level] if axes.fan_in is not None else 1.0)
            for axes in layout.leaves])
    submodel = None if factors is None else SubModel(
        lambda *args: (None, factors), lambda *args: None)
    small_spec = dataclasses.replace(
        spec, model=small, algorithm=dataclasses.replace(
            spec.algorithm, hooks=() if submodel is None else (submodel,)))
    trained = width_mask(layout, jnp.int32(level), offset)
    small_payload = payload.replace(params=params)

    def client(client_state: ClientState, task):
        update, client_state, stats = local_update(
            small_spec, hyper, small_payload, client_state, task, data)
        return update, client_state, stats.replace(trained=trained)

    return client, functools.partial(put_units, layout, offset=offset)


WIDTH_FROM = ("uniform", "speed")


def _checked(name: str, widths: tuple[float, ...], client_levels: tuple[int, ...],
             width_from: str, dense_and_dropout: bool) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """The widths and the given levels, checked (one-line ValueErrors)."""
    widths = check_widths(widths)
    if dense_and_dropout:
        raise ValueError(f"{name}: dense_groups needs one width per client and round; ordered "
                         "dropout draws one per step")
    if width_from not in WIDTH_FROM:
        raise ValueError(f"width_from must be one of {WIDTH_FROM}, got {width_from!r}")
    return widths, check_levels(client_levels, widths)


def width_fedavg(
    name: str, widths: tuple[float, ...], *, ordered_dropout: bool, rolling: bool, scaler: bool,
    client_levels: tuple[int, ...] = (), width_from: str = "uniform", client_lr: float = 0.05,
    server_lr: float = 1.0, dense_groups: bool = False,
) -> FederatedAlgorithm:
    """FedAvg in which client ``k`` trains the sub-model of its width level (``SubModel``).

    Args:
      name: registry name.
      widths: the width ratios, widest first (``check_widths``).
      ordered_dropout: each local step trains a width drawn uniformly from the client's
        level and narrower (FjORD); else every step trains the client's own width.
      rolling: the window of kept units starts at unit ``round mod units`` (FedRolex); else
        at unit 0.
      scaler: HeteroFL's scaler in training (``width_mask``).
      client_levels: each client's level (an index of ``widths``, one per client of the
        population); empty: from ``width_from``.
      width_from: with ``client_levels`` empty, "uniform": client ``k`` gets level
        ``k mod L``; "speed": the levels must come from the clients' step times
        (``levels_by_speed``, faster devices wider), which the config derives from its
        [system] and passes as ``client_levels``.
      client_lr, server_lr: the clients' and the server's SGD learning rates (traced).
      dense_groups: the clients of each level may train a dense sub-model of the level's
        width (``dense_client``, ``engine.groups``) instead of masks on the full model; not
        with ``ordered_dropout`` (a width per step).
    """
    widths, given = _checked(name, widths, client_levels, width_from,
                             dense_groups and ordered_dropout)
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=masked_mean(), client_start=_start, name=name,
    )

    def population(num_clients: int) -> np.ndarray:
        """``[N]`` each client's level: ``client_levels``, or ``k mod L``."""
        if given and len(given) != num_clients:
            raise ValueError(f"{name}: client_levels names {len(given)} clients, the "
                             f"population has {num_clients}")
        if width_from == "speed" and not given:
            raise ValueError(f"{name}: width_from = 'speed' needs each client's level from "
                             "its step time (submodels.levels_by_speed) as client_levels")
        return np.asarray(given) if given else np.arange(num_clients) % len(widths)

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> WidthState:
        return WidthState(base.server_init(params, hyper, num_clients),
                          jnp.asarray(population(num_clients), jnp.int32),
                          jnp.zeros((), jnp.int32))

    def client_costs(num_clients: int, model: Model, x: jax.ShapeDtypeStruct) -> ClientCosts:
        return width_costs(model, x, widths, population(num_clients), ordered_dropout)

    def server_update(state: WidthState, aggregate, hyper: Hyper, key=None) -> WidthState:
        model = base.server_update(state.model, aggregate, hyper, key)
        return WidthState(model, state.levels, state.round + 1)

    def window(model: Model, x: jax.Array, ctx: LocalContext):
        payload = ctx.broadcast
        layout = unit_layout(model, ctx.start, x, widths)
        return layout, payload.levels[ctx.client_id], payload.round if rolling else 0

    def step(model: Model, x: jax.Array, ctx: LocalContext, hyper: Hyper, key: PRNGKey):
        del hyper
        layout, level, offset = window(model, x, ctx)
        if ordered_dropout:
            level = jax.random.randint(key, (), level, len(widths), jnp.int32)
        mask = width_mask(layout, level, offset)
        return mask, (width_mask(layout, level, offset, scaler=True) if scaler else mask)

    def trained(model: Model, x: jax.Array, ctx: LocalContext, hyper: Hyper) -> PyTree:
        del hyper
        return width_mask(*window(model, x, ctx))

    groups = _dense_levels(widths, rolling, scaler) if dense_groups else None
    return dataclasses.replace(
        base, server_init=server_init, broadcast=lambda s: WidthPayload(s.model.params,
        s.levels, s.round), server_update=server_update,
        global_params=lambda s: s.model.params,
        hooks=(SubModel(step, trained, groups, client_costs), PayloadBytes(_payload)),
    )
