"""Sub-models of a model's width as masks: the common part of FjORD, HeteroFL and FedRolex.

A client of width ratio ``p`` in (0, 1] trains, in every hidden layer of ``n`` units, the
``k = ceil(p n)`` units of a window starting at ``offset``: unit ``u`` is kept when
``(u - offset) mod n < k`` (offset 0: the leading ``k`` units, Diao et al. 2021, §3.1;
offset ``r mod n`` in round ``r``: FedRolex, Alam et al. 2022, Eq. 3). The model's input
and its output keep their full size. The sub-model is not cut out of the params: it is a
0/1 mask of their shape (``engine.algorithm.SubModel``), so a cohort of different widths
trains as one vmapped program, and a mask of ratio 1 is all ones (the full model, bit for
bit). Masks alone cost full width in simulation time (wall clock); a client that trains one
width for the round may instead train the dense sub-model of its kept units
(``take_units``, ``put_units``; ``algorithms/width_fedavg.py``). The
simulated schedule prices each client's width (``width_costs``): its step time times its
width's share of the forward FLOPs (``level_flops``), its bytes both ways times its
width's share of the params (``level_counts``), and FjORD's step the mean share over its
draws; its ``ClientStats.work_kept`` (FreezeFL's selection) is its ratio ``p``.

**Unit axes, from the params' shapes.** A *layer* is a top-level entry of the params
(a Linen module: ``Dense_0``, ``Conv_1``, ``OptimizedLSTMCell_0``, ``Embed_0``),
ordered by first use in the model's forward pass (traced once). Every leaf's last axis is
its layer's units (Dense kernel ``[in, out]``, Conv kernel ``[h, w, in, out]``, bias
``[out]``, embedding ``[vocab, out]``, an RNN cell's kernels ``[in or units, units]``);
every layer but the last is hidden, and its unit axis is masked. A kernel's fan-in axis
(``-2``) reads: the layer's own units, when it has that size and the layer also holds a
kernel of another fan-in (a recurrent cell's state); else, in the first layer, the
model's input (kept); else the previous layer's units, flattened channel-last
(``fan_in = repeat * units``, the unit of row ``i`` being ``i mod units``: a conv's
``[H, W, C]`` output reshaped for a dense layer). A model whose layers cannot be read so
(leaves of one layer ending in different sizes, a fan-in that is no multiple of the
previous units) or that has no hidden layer is refused in one line.

**Scaler** (HeteroFL, §3.1: ``Scaler(p)`` divides a hidden layer's output by ``p`` in
training, identity at evaluation): here every fan-in row that reads masked units is
multiplied by ``1 / p`` in the training forward pass, the same function for the
positively homogeneous ReLU and max-pool of the MLP and CNN, and for the RNN cells the
hidden state scaled by ``1 / p`` wherever it is read.

>>> import jax
>>> from fedjax_het import models
>>> model = models.mlp((4,), 3, hidden=(5,))
>>> params = model.init(jax.random.key(0))
>>> layout = unit_layout(model, params, jax.numpy.zeros((1, 4)), levels=(1.0, 0.5))
>>> [(leaf.fan_in, leaf.out) for leaf in layout.leaves]  # Dense_0 bias, kernel; Dense_1 ...
[(None, 5), (None, 5), (None, None), (5, None)]
>>> mask = width_mask(layout, 1)  # ratio levels[1] = 0.5: ceil(0.5 * 5) = 3 units kept
>>> mask["Dense_0"]["kernel"][0].tolist()
[1.0, 1.0, 1.0, 0.0, 0.0]
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np

from fedjax_het import models
from fedjax_het.engine.flops import PRODUCTS, product_flops
from fedjax_het.engine.hooks import ClientCosts
from fedjax_het.models import Model, kept_units
from fedjax_het.typing import Params, PyTree


def check_widths(widths: tuple[float, ...], name: str = "widths") -> tuple[float, ...]:
    """``widths`` as floats if they are ratios in (0, 1], strictly decreasing (each level's
    units nest inside the previous one's); else a one-line ValueError."""
    widths = tuple(float(p) for p in widths)
    if not widths:
        raise ValueError(f"{name} must name at least one width ratio")
    bad = [p for p in widths if not 0.0 < p <= 1.0]
    if bad:
        raise ValueError(f"{name}: a width ratio must lie in (0, 1], got {bad[0]:g}")
    if any(a <= b for a, b in itertools.pairwise(widths)):
        raise ValueError(
            f"{name} must be strictly decreasing from the widest, so that each sub-model "
            f"nests in the wider ones; got {list(widths)}"
        )
    return widths


@dataclasses.dataclass(frozen=True)
class LeafAxes:
    """The unit axes of one params leaf: ``out`` units of its last axis when masked (a hidden
    layer's), ``fan_in`` units its axis -2 reads when masked (each ``repeat`` times)."""

    out: int | None
    fan_in: int | None
    repeat: int = 1


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a model's hidden units lie in its params (see the module docstring).

    Attributes:
      treedef: the params' tree structure.
      shapes: each leaf's shape, in tree order.
      leaves: each leaf's ``LeafAxes``, in tree order.
      levels: the width ratios the masks are built for, widest first.
    """

    treedef: jax.tree_util.PyTreeDef
    shapes: tuple[tuple[int, ...], ...]
    leaves: tuple[LeafAxes, ...]
    levels: tuple[float, ...] = (1.0, 0.5)

    @property
    def units(self) -> tuple[int, ...]:
        """The distinct sizes of masked unit axes."""
        sizes = {a.out for a in self.leaves} | {a.fan_in for a in self.leaves}
        return tuple(sorted(s for s in sizes if s is not None))


def _layer_axes(name: str, shapes: list[tuple[int, ...]], first: bool, hidden: bool,
                previous: int | None, where: str) -> list[LeafAxes]:
    """The ``LeafAxes`` of one layer's leaves (shapes in tree order)."""
    ends = {shape[-1] for shape in shapes if shape}
    if len(ends) != 1:
        raise ValueError(f"{where}: cannot tell the units of layer {name}: its params end in "
                         f"sizes {sorted(ends)}")
    units = ends.pop()
    fan_ins = {shape[-2] for shape in shapes if len(shape) >= 2}
    axes = []
    for shape in shapes:
        fan_in, repeat = None, 1
        if len(shape) >= 2:
            f = shape[-2]
            if f == units and len(fan_ins) > 1:
                fan_in = units  # a recurrent cell's state
            elif not first:
                if f % previous:
                    raise ValueError(f"{where}: layer {name} reads {f} inputs, not a multiple "
                                     f"of the previous layer's {previous} units")
                fan_in, repeat = previous, f // previous
        axes.append(LeafAxes(units if hidden and shape else None, fan_in, repeat))
    return axes


@functools.lru_cache(maxsize=64)
def _cached_layout(model: Model, treedef, shapes, dtypes, x_shape, x_dtype) -> Layout:
    params = jax.tree.unflatten(treedef, [jnp.zeros(s, d) for s, d in zip(shapes, dtypes)])
    where = f"width masks of model {model.name}"
    order = models.layer_order(model, params, jnp.zeros(x_shape, x_dtype))
    if len(order) < 2:
        raise ValueError(f"{where}: the model has no hidden units to mask (one layer: "
                         f"{', '.join(order)})")
    paths = [path[0].key for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    axes: dict[int, LeafAxes] = {}
    previous = None
    for depth, name in enumerate(order):
        index = [i for i, p in enumerate(paths) if p == name]
        layer = _layer_axes(name, [shapes[i] for i in index], depth == 0,
                            depth < len(order) - 1, previous, where)
        axes.update(zip(index, layer))
        previous = shapes[index[0]][-1]
    return Layout(treedef, shapes, tuple(axes[i] for i in range(len(paths))))


def unit_layout(model: Model, params: Params, x: jax.Array,
                levels: tuple[float, ...] = (1.0, 0.5)) -> Layout:
    """The ``Layout`` of ``model``'s params (shapes only; computed once per model and shapes),
    for the width ratios ``levels`` (widest first)."""
    leaves, treedef = jax.tree.flatten(params)
    layout = _cached_layout(
        model, treedef, tuple(tuple(leaf.shape) for leaf in leaves),
        tuple(jnp.dtype(leaf.dtype) for leaf in leaves), tuple(x.shape), jnp.dtype(x.dtype),
    )
    return dataclasses.replace(layout, levels=check_widths(levels))


def unit_mask(layout: Layout, units: int, level: jax.Array, offset: jax.Array) -> jax.Array:
    """``[units]`` 0/1: the window of ``ceil(p units)`` units from ``offset mod units``,
    ``p = layout.levels[level]``."""
    kept = jnp.asarray([kept_units(p, units) for p in layout.levels], jnp.int32)[level]
    return ((jnp.arange(units) - offset) % units < kept).astype(jnp.float32)


def width_mask(layout: Layout, level: jax.Array, offset: jax.Array = 0,
               scaler: bool = False) -> PyTree:
    """The params' 0/1 mask at width ``layout.levels[level]`` (traced), each leaf an array
    broadcastable to it; with ``scaler``, fan-in rows reading masked units times ``1 / p``."""
    vectors = {n: unit_mask(layout, n, level, offset) for n in layout.units}
    ratio = jnp.asarray(layout.levels, jnp.float32)[level]
    masks = []
    for shape, axes in zip(layout.shapes, layout.leaves):
        out = vectors[axes.out] if axes.out is not None else jnp.ones((1,), jnp.float32)
        if len(shape) < 2:
            masks.append(out if axes.out is not None else jnp.ones((), jnp.float32))
            continue
        rows = jnp.ones((1,), jnp.float32)
        if axes.fan_in is not None:
            rows = jnp.tile(vectors[axes.fan_in], axes.repeat) * (1.0 / ratio if scaler else 1.0)
        masks.append((rows[:, None] * out[None, :]).reshape((1,) * (len(shape) - 2)
                                                             + (rows.size, out.size)))
    return jax.tree.unflatten(layout.treedef, masks)


def _window(x: jax.Array, axis: int, units: int, repeat: int, kept: int | None,
            offset: jax.Array) -> jax.Array:
    """Axis ``axis`` of ``x`` (``repeat`` runs of ``units``, channel-last) cut to the ``kept``
    units of the window from ``offset`` (``unit_mask``'s ones, in window order), or with
    ``kept`` None widened back: the window's values at their units, zeros elsewhere. A roll
    and a slice or a pad (no gather or scatter: XLA:CPU runs those an element at a time)."""
    axis = axis % x.ndim
    grid = x.reshape(*x.shape[:axis], repeat, x.shape[axis] // repeat, *x.shape[axis + 1:])
    if kept is not None:
        grid = jax.lax.slice_in_dim(jnp.roll(grid, -offset, axis + 1), 0, kept, axis=axis + 1)
    else:
        pad = [(0, 0)] * grid.ndim
        pad[axis + 1] = (0, units - grid.shape[axis + 1])
        grid = jnp.roll(jnp.pad(grid, pad), offset, axis + 1)
    return grid.reshape(*x.shape[:axis], -1, *x.shape[axis + 1:])


def _cut_leaves(layout: Layout, tree: Params, level: int | None, offset: jax.Array) -> Params:
    """Each leaf of ``tree`` cut to width level ``level``'s window, or widened (None)."""
    leaves = []
    for leaf, axes in zip(jax.tree.leaves(tree), layout.leaves):
        for axis, units, repeat in ((-1, axes.out, 1), (-2, axes.fan_in, axes.repeat)):
            if units is not None:
                kept = None if level is None else kept_units(layout.levels[level], units)
                leaf = _window(leaf, axis, units, repeat, kept, offset)
        leaves.append(leaf)
    return jax.tree.unflatten(layout.treedef, leaves)


def take_units(layout: Layout, params: Params, level: int, offset: jax.Array = 0) -> Params:
    """The dense sub-model's params at width ``layout.levels[level]``: each leaf's kept units
    on its unit axes, in window order (unit ``(offset + i) mod n`` as unit ``i``); the
    shapes ``Model.at_width`` builds."""
    return _cut_leaves(layout, params, level, offset)


def put_units(layout: Layout, small: Params, offset: jax.Array = 0) -> Params:
    """``take_units`` undone: ``small``'s values at their units of the full shapes, 0 elsewhere."""
    return _cut_leaves(layout, small, None, offset)


def _kept_entries(layout: Layout, level: int) -> list[int]:
    """Each leaf's entries kept at width level ``level``, in tree order."""
    mask = width_mask(layout, jnp.int32(level))
    return [int(np.broadcast_to(np.asarray(m), s).sum())
            for m, s in zip(jax.tree.leaves(mask), layout.shapes)]


def level_counts(layout: Layout) -> np.ndarray:
    """``[L]`` params each width level trains (and uploads), from its masks (exact)."""
    return np.asarray([sum(_kept_entries(layout, level)) for level in range(len(layout.levels))],
                      np.int64)


# Ops that pass a kernel on unchanged in value (a gate's kernels concatenated, a cast):
# a product reading their output reads those kernels.
_KERNEL_VIEWS = {"concatenate", "convert_element_type", "copy", "reshape", "transpose",
                 "squeeze", "expand_dims"}


def _products(jaxpr, kernels: dict, times: float, found: list) -> None:
    """Appends ``(leaf ids, flops)`` for every product in ``jaxpr`` (nested ones included, a
    scan's ``length`` times) whose operand is a params kernel; ``kernels``: var -> leaf ids."""
    for eqn in jaxpr.eqns:
        read = [kernels.get(v, frozenset()) if isinstance(v, jcore.Var) else frozenset()
                for v in eqn.invars]
        name = eqn.primitive.name
        if name in PRODUCTS and any(read):
            found.append((frozenset().union(*read), times * product_flops(eqn)))
        elif name in _KERNEL_VIEWS and read and all(read):
            kernels[eqn.outvars[0]] = frozenset().union(*read)
        for sub in jcore.jaxprs_in_params(eqn.params):
            if len(sub.invars) == len(eqn.invars):
                inner = {v: ids for v, ids in zip(sub.invars, read) if ids}
                _products(sub, inner, times * eqn.params.get("length", 1), found)


def level_flops(model: Model, layout: Layout, x: jax.ShapeDtypeStruct) -> np.ndarray:
    """``[L]`` each width level's share of the full model's forward FLOPs on ``x``.

    XLA counts a masked product at full size (``params * mask`` is still a dense product),
    so the masked forward's cost analysis does not shrink. Each product of the forward
    pass (its jaxpr's ``dot_general`` and convolutions, a scan's body times its length) is
    counted from its shapes, 2 FLOPs a multiply-add as XLA does, and at a width costs its
    kernels' kept entries over their size: a dense layer's ``kept_in x kept_out``
    multiply-adds a position, a convolution's the same per output pixel. Elementwise work
    (biases, activations, pooling; a few percent of a dense model) is left out, and a
    step's backward pass is taken to shrink as its forward does (its two products per
    kernel are kernel-sized too).
    """
    abstract = [jax.ShapeDtypeStruct(s, jnp.float32) for s in layout.shapes]
    closed = jax.make_jaxpr(lambda ls, xs: model.apply(
        jax.tree.unflatten(layout.treedef, ls), xs, train=False, key=None))(
        abstract, jax.ShapeDtypeStruct(x.shape, x.dtype))
    kernels = {v: frozenset([i]) for i, v in enumerate(closed.jaxpr.invars[: len(abstract)])
               if len(layout.shapes[i]) >= 2}
    found: list = []
    _products(closed.jaxpr, kernels, 1.0, found)
    if not found:
        raise ValueError(f"width costs of model {model.name}: its forward pass has no "
                         "matrix product or convolution with a params kernel")
    size = [math.prod(shape) for shape in layout.shapes]
    shares = []
    for level in range(len(layout.levels)):
        kept = _kept_entries(layout, level)
        shares.append(sum(f * sum(kept[i] for i in ids) / sum(size[i] for i in ids)
                          for ids, f in found) / sum(f for _, f in found))
    return np.asarray(shares, np.float64)


def levels_by_speed(step_time: np.ndarray, num_levels: int) -> tuple[int, ...]:
    """Each client's width level from its step time by quantile: the fastest ``1 / L`` of the
    clients get level 0 (widest), the slowest ``1 / L`` level ``L - 1``; ties by client id."""
    step_time = np.asarray(step_time, np.float64)
    rank = np.empty(step_time.size, np.int64)
    rank[np.argsort(step_time, kind="stable")] = np.arange(step_time.size)
    return tuple(int(level) for level in rank * num_levels // max(step_time.size, 1))


@jax.ensure_compile_time_eval()  # host numbers, also when asked inside a traced round
def width_costs(model: Model, x: jax.ShapeDtypeStruct, widths: tuple[float, ...],
                levels: np.ndarray, ordered_dropout: bool) -> ClientCosts:
    """Each client's ``ClientCosts`` at its width level ``levels[k]`` (``[N]``): the level's
    FLOPs share (``level_flops``; with ``ordered_dropout``, the mean over the levels it
    draws from), its kept params' share of the bytes, and its ratio as work kept."""
    params = jax.eval_shape(model.init, jax.random.key(0))
    layout = unit_layout(model, params, x, widths)
    compute = level_flops(model, layout, x)
    if ordered_dropout:  # the expectation over the per-step draws U{level, ..., L - 1}
        compute = np.asarray([compute[level:].mean() for level in range(len(widths))])
    size = sum(math.prod(shape) for shape in layout.shapes)
    return ClientCosts(compute[levels], level_counts(layout)[levels] / size,
                       np.asarray(widths)[levels])
