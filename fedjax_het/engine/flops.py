"""Floating-point operations counted from a program's shapes, without XLA (docs/design.md §3).

XLA's cost analysis is backend-specific: on some backends a lowered program
reports no ``flops`` at all. This count needs only the jaxpr: every matrix
product (``dot_general``) and convolution (``conv_general_dilated``) of the
traced function, nested jaxprs included (a ``scan``'s body ``length`` times),
at 2 FLOPs a multiply-add, as XLA's cost analysis counts them. Elementwise work
(biases, activations, pooling; a few percent of a dense model) is left out.

>>> import jax
>>> from fedjax_het import models
>>> model = models.mlp((4,), 3, hidden=(5,))
>>> forward_flops(model, jax.ShapeDtypeStruct((1, 4), "float32"))  # 2 x (4 x 5 + 5 x 3)
70.0
"""

from __future__ import annotations

import math

import jax
import jax.extend.core as jcore

from fedjax_het.models import Model

PRODUCTS = ("dot_general", "conv_general_dilated")


def product_flops(eqn) -> float:
    """FLOPs of one ``dot_general`` or ``conv_general_dilated`` equation from its shapes
    (2 per multiply-add), as XLA's cost analysis counts them."""
    out = math.prod(eqn.outvars[0].aval.shape)
    if eqn.primitive.name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        return 2.0 * out * math.prod(eqn.invars[0].aval.shape[d] for d in contract)
    rhs = eqn.invars[1].aval.shape
    return 2.0 * out * math.prod(rhs) / rhs[eqn.params["dimension_numbers"].rhs_spec[0]]


def jaxpr_flops(jaxpr, times: float = 1.0) -> float:
    """The products' FLOPs in ``jaxpr`` and the jaxprs nested in its equations (a ``scan``'s
    ``length`` times; a ``while`` loop's body once: its trip count is not in the shapes)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in PRODUCTS:
            total += times * product_flops(eqn)
        for sub in jcore.jaxprs_in_params(eqn.params):
            total += jaxpr_flops(sub, times * eqn.params.get("length", 1))
    return total


def forward_flops(model: Model, x: jax.ShapeDtypeStruct) -> float:
    """FLOPs of ``model``'s training forward pass on a batch shaped like ``x`` (its products)."""
    params = jax.eval_shape(model.init, jax.random.key(0))
    closed = jax.make_jaxpr(lambda p, x: model.apply(p, x, train=True, key=jax.random.key(0)))(
        params, x
    )
    return jaxpr_flops(closed.jaxpr)
