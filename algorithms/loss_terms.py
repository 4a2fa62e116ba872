"""Terms that algorithms add to a client's local loss: a squared distance between models
(FedProx's proximal term, Ditto's pull, FedAsync's drift) and a term of value 0 with a given
gradient (SCAFFOLD's and Mime's correction, FedDyn's regulariser)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.typing import Params


def squared_distance(a: Params, b: Params) -> jax.Array:
    """``||a - b||^2`` over every leaf."""
    return sum(jax.tree.leaves(jax.tree.map(lambda x, y: jnp.sum(jnp.square(x - y)), a, b)))


@jax.custom_jvp
def _zero_with_gradient(y: jax.Array, direction: jax.Array) -> jax.Array:
    return jnp.zeros((), y.dtype)


@_zero_with_gradient.defjvp
def _zero_with_gradient_jvp(primals, tangents):
    y, direction = primals
    y_dot, _ = tangents
    return jnp.zeros((), y.dtype), jnp.sum(y_dot * direction.astype(y_dot.dtype))


def gradient_term(params: Params, direction: Params) -> jax.Array:
    """A loss term of value 0 whose gradient in ``params`` is ``direction``, held constant.

    Added to a local loss, it adds ``direction`` to each step's gradient without
    computing the value of the term it stands for (SCAFFOLD's ``<y, c - c_i>``,
    FedDyn's regulariser): one pass over the params fewer per step, and the
    reported loss stays the model's. First derivatives only.

    >>> grad = jax.grad(lambda y: gradient_term(y, {"w": jnp.array([1.0, -2.0])}))
    >>> grad({"w": jnp.zeros(2)})["w"].tolist()
    [1.0, -2.0]
    """
    return sum(jax.tree.leaves(jax.tree.map(_zero_with_gradient, params, direction)))
