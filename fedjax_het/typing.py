"""Names for the roles that pytrees and arrays play in fedjax_het."""

from typing import Any

import jax

PyTree = Any  # any nested structure of arrays that jax.tree_util understands
Params = PyTree  # trainable model parameters of one model (no client axis)
ClientState = PyTree  # persistent per-client algorithm state (stacked [num_clients, ...] at rest)
ServerState = PyTree  # algorithm state held by the server between rounds
Update = PyTree  # what one client sends back: a pytree shaped like Params
Mask = jax.Array  # 0/1 or boolean array that switches work or influence off without changing shapes
Hyper = dict[str, jax.Array]  # traced numeric hyperparameters, one scalar per name
PRNGKey = jax.Array  # a jax.random key (typed or raw uint32[2])
Batch = tuple[jax.Array, jax.Array, jax.Array]  # (x, y, example_mask) of one local step
