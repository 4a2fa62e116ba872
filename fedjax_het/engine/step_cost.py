"""The chunk a backend prefers before memory is counted (docs/design.md §3, §8).

``cohort.auto_chunk`` holds the rules; this module reads what they need from
the round: the backend, whether the model convolves (XLA:CPU runs batched
convolutions slowly) and, when the clients' work varies on an accelerator, one
client's step in floating-point operations (``step_cost``). The step's cost is
XLA's count of the lowered forward pass where the backend gives one, else a
count from the model's shapes (``flops.forward_flops``), never "free": a step
taken as costless would make every chunk look too small to fill the device and
run a varying cohort as one chunk, which is what happened on an H200 whose
``Lowered.cost_analysis()`` held no ``flops``.

>>> from fedjax_het import models
>>> from fedjax_het.algorithms import fedavg
>>> from fedjax_het.data import LocalWork
>>> from fedjax_het.engine.local import LocalSpec
>>> from fedjax_het.engine.memory import abstract_split
>>> spec = LocalSpec(models.mlp((4,), 3, hidden=(5,)), fedavg(), LocalWork(batch_size=2), 1, 2)
>>> cost = step_cost(spec, abstract_split(rows=8, example=(4,), num_clients=4))
>>> cost.flops >= 3 * 2 * 70.0, cost.source in SOURCES
(True, True)
"""

from __future__ import annotations

import dataclasses

import jax

from fedjax_het.engine.cohort import auto_chunk
from fedjax_het.engine.flops import forward_flops
from fedjax_het.engine.local import DeviceSplit, LocalSpec
from fedjax_het.models import Model

SOURCES = ("xla", "shapes")
SAID = {
    "xla": "XLA's cost analysis",
    "shapes": "counted from the model's shapes: XLA's cost analysis gave no flops",
}


@dataclasses.dataclass(frozen=True)
class StepCost:
    """One client's local step: ``flops`` (forward x 3 for the backward pass, x the batch),
    and where the forward's count came from (``SOURCES``)."""

    flops: float
    source: str

    def describe(self) -> str:
        return f"{self.flops:.3g} FLOPs a step ({SAID[self.source]})"


def planning_backend() -> str:
    """The backend the plan is made for (a test may plan for another)."""
    return jax.default_backend()


def preferred_chunk(
    spec: LocalSpec, train: DeviceSplit, cohort: int, work_varies: bool = False
) -> tuple[int, StepCost | None]:
    """``cohort.auto_chunk`` for this round on ``planning_backend()``, and the step cost it
    was given (None: not asked, the clients' work does not vary or the backend is a CPU)."""
    backend = planning_backend()
    cost = step_cost(spec, train) if work_varies and backend != "cpu" else None
    chunk = auto_chunk(
        cohort,
        backend=backend,
        convolutional=convolutional(spec.model, train.x),
        step_flops=None if cost is None else cost.flops,
    )
    return chunk, cost


def step_cost(spec: LocalSpec, train: DeviceSplit) -> StepCost:
    """One client's local step: the forward pass on one example, counted by XLA from the
    lowered program (never compiled) or, where that holds no flops, from the model's shapes;
    x 3 for the backward pass, x the batch size."""
    example = jax.ShapeDtypeStruct((1, *train.x.shape[1:]), train.x.dtype)
    flops, source = _xla_forward_flops(spec.model, example), "xla"
    if not flops:
        flops, source = forward_flops(spec.model, example), "shapes"
    return StepCost(3.0 * max(flops, 1.0) * spec.work.batch_size, source)


def _xla_forward_flops(model: Model, example: jax.ShapeDtypeStruct) -> float:
    """XLA's flops of the lowered forward pass; 0 where the backend reports none."""
    params = jax.eval_shape(model.init, jax.random.key(0))
    forward = jax.jit(lambda p, x: model.apply(p, x, train=True, key=jax.random.key(0)))
    cost = forward.lower(params, example).cost_analysis() or {}
    cost = (cost[0] if cost else {}) if isinstance(cost, list) else cost  # a list in older JAX
    return float(cost.get("flops", 0.0) or 0.0)


def convolutional(model: Model, x: jax.Array) -> bool:
    """Whether ``model``'s forward pass on a batch like ``x`` holds a convolution."""
    example = jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype)
    params = jax.eval_shape(model.init, jax.random.key(0))
    closed = jax.make_jaxpr(lambda p, x: model.apply(p, x, train=True, key=jax.random.key(0)))(
        params, example
    )
    return "conv_general_dilated" in _primitives(closed.jaxpr)


def _primitives(jaxpr) -> set[str]:
    """The names of every primitive in ``jaxpr`` and the jaxprs nested in its equations."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _primitives(inner)
    return names
