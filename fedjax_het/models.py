"""Models as three pure functions, and the small model zoo (docs/design.md §3).

A :class:`Model` is ``init(key) -> params``, ``apply(params, x, *, train, key)
-> outputs`` and a per-example loss; ``loss(outputs, y, mask)`` is its masked
mean. :func:`from_linen` turns any Flax linen module into one, :func:`from_nnx` any
Flax NNX module (or a function that builds one from its ``rngs``).

The zoo holds the models the papers use: logistic regression, the MLP of the throughput
workload W1, the LEAF FEMNIST CNN (Caldas et al. 2018, "LEAF: A Benchmark for Federated
Settings", §4: two 5x5 conv layers of 32 and 64 channels, each with 2x2 max-pooling, a
2048-unit dense layer, a softmax output) and LEAF's Shakespeare character LSTM (§4: an 8-d
embedding, two LSTM layers of 256 units, a dense layer to the vocabulary).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_het import convolution
from fedjax_het.typing import Mask, Params, PRNGKey

if TYPE_CHECKING:  # from_nnx imports flax.nnx itself: a tenth of the CLI's start-up otherwise
    from flax import nnx


@dataclasses.dataclass(frozen=True)
class Model:
    """A model as pure functions over an explicit params pytree.

    Attributes:
      init: ``key -> params``.
      apply: ``(params, x, *, train, key) -> outputs`` for a batch ``x``.
      per_example_loss: ``(outputs, y) -> [batch]`` losses.
      name: a short name for logs.
      at_width: ``p -> Model``: the same architecture with each hidden layer of ``n``
        units cut to ``kept_units(p, n)`` (its input and output kept), whose params are
        the full model's sliced to those units; a dense sub-model that trains a width
        level faster than masks do (``algorithms/submodels.py``). None: no such model
        (a sub-model then trains as masks on the full one).
      conv: the formulation its convolutions run as (``convolution.CONV_IMPLS``); None:
        the model offers no choice.
      with_conv: ``impl -> Model``: the same function with its convolutions run as ``impl``
        (the engine's plan picks one, ``conv_choice.conv_impl_for``); None: no choice.
    """

    init: Callable[[PRNGKey], Params]
    apply: Callable[..., jax.Array]
    per_example_loss: Callable[[jax.Array, jax.Array], jax.Array]
    name: str = "model"
    at_width: Callable[[float], Model] | None = None
    conv: str | None = None
    with_conv: Callable[[str], Model] | None = None

    def loss(self, outputs: jax.Array, y: jax.Array, mask: Mask) -> jax.Array:
        """Mean loss over the examples that ``mask`` keeps (0 when it keeps none)."""
        mask = mask.astype(outputs.dtype)
        total = jnp.sum(self.per_example_loss(outputs, y) * mask)
        return total / jnp.maximum(jnp.sum(mask), 1.0)


def kept_units(ratio: float, units: int) -> int:
    """A hidden layer's units at width ``ratio``: ``ceil(ratio * units)``, at least 1, in exact
    decimal arithmetic (``0.7 * 10`` is 7; Diao et al. 2021, §3.1)."""
    return max(1, math.ceil(Fraction(repr(ratio)) * units))


def _widths(build: Callable[[Callable[[int], int]], Model]) -> Model:
    """``build(identity)`` with ``at_width(p)`` = ``build(lambda n: kept_units(p, n))``."""

    def at_width(ratio: float) -> Model:
        return build(functools.partial(kept_units, ratio))

    return dataclasses.replace(build(lambda units: units), at_width=at_width)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """``[batch]`` cross-entropies; with sequence labels ``[batch, positions]`` (logits
    ``[batch, positions, classes]``), each example's mean over its positions."""
    return _per_example(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def per_example_correct(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """``[batch]`` float32: 1 where the arg-max output is the label; with sequence labels, the
    share of each example's positions predicted right (so accuracy is per position)."""
    return _per_example((jnp.argmax(outputs, -1) == labels).astype(jnp.float32))


def _per_example(values: jax.Array) -> jax.Array:
    """Each example's mean over its positions (an unbatched or ``[batch]`` array unchanged)."""
    return values if values.ndim <= 1 else values.reshape(values.shape[0], -1).mean(axis=1)


def from_linen(
    module: nn.Module,
    example_shape: Sequence[int],
    *,
    per_example_loss: Callable[[jax.Array, jax.Array], jax.Array] = softmax_cross_entropy,
    name: str | None = None,
    input_dtype: jax.typing.DTypeLike = jnp.float32,
) -> Model:
    """Adapts a Flax linen module whose ``__call__(x[, train])`` maps a batch to outputs.

    Only the ``params`` collection is trained; a module that keeps mutable
    collections (BatchNorm statistics) needs client state and is not supported
    by this adapter. ``input_dtype`` is the dtype of the zeros that ``init``
    traces the module with (an integer type for token inputs).

    >>> model = from_linen(nn.Dense(3), (4,))
    >>> params = model.init(jax.random.key(0))
    >>> model.apply(params, jnp.ones((2, 4)), train=False, key=None).shape
    (2, 3)
    """
    takes_train = "train" in inspect.signature(module.__call__).parameters
    example_shape = tuple(example_shape)

    def call_kwargs(train: bool) -> dict:
        return {"train": train} if takes_train else {}

    def init(key: PRNGKey) -> Params:
        dummy = jnp.zeros((1, *example_shape), input_dtype)
        return module.init(key, dummy, **call_kwargs(False))["params"]

    def apply(params: Params, x: jax.Array, *, train: bool, key: PRNGKey | None) -> jax.Array:
        rngs = {"dropout": key} if (train and key is not None) else None
        return module.apply({"params": params}, x, rngs=rngs, **call_kwargs(train))

    return Model(init, apply, per_example_loss, name or type(module).__name__)


def from_nnx(
    module: nnx.Module | Callable[[nnx.Rngs], nnx.Module],
    *,
    per_example_loss: Callable[[jax.Array, jax.Array], jax.Array] = softmax_cross_entropy,
    name: str | None = None,
) -> Model:
    """Adapts a Flax NNX module whose ``__call__(x)`` maps a batch to outputs.

    ``module`` is either a function of ``rngs`` that builds the module (``lambda rngs:
    MLP(784, 10, rngs=rngs)``): then ``init(key)`` builds it from ``nnx.Rngs(key)``, so each
    run's seed draws its own initial weights; or a built module: then every run starts from
    its weights, whatever the seed (fine-tuning from given weights). Only ``nnx.Param``
    variables are trained. Random streams (``nnx.Dropout``) are reseeded from the round's key
    in training and switched off (``eval()``) otherwise; a module that keeps other state
    (BatchNorm's ``BatchStat``) needs client state and is refused.

    >>> from flax import nnx
    >>> model = from_nnx(lambda rngs: nnx.Linear(4, 3, rngs=rngs))
    >>> params = model.init(jax.random.key(0))
    >>> model.apply(params, jnp.ones((2, 4)), train=False, key=None).shape
    (2, 3)
    """
    from flax import nnx  # here, not at the top (see the TYPE_CHECKING import)
    built = module if isinstance(module, nnx.Module) else module(nnx.Rngs(0))
    graph, params, rest = nnx.split(built, nnx.Param, ...)
    variables = jax.tree.leaves(rest, is_leaf=lambda v: isinstance(v, nnx.Variable))
    kept = sorted({type(v).__name__ for v in variables if not isinstance(v, nnx.RngState)})
    if kept:
        raise ValueError(
            f"from_nnx: {type(built).__name__} keeps {', '.join(kept)} variables besides its "
            "params (BatchNorm statistics, say), which need client state; use a module "
            "without them (LayerNorm, GroupNorm)"
        )
    streams = sorted({v.tag for v in variables if isinstance(v, nnx.RngKey)})

    def init(key: PRNGKey) -> Params:
        if isinstance(module, nnx.Module):
            return nnx.to_pure_dict(params)
        return nnx.to_pure_dict(nnx.split(module(nnx.Rngs(key)), nnx.Param, ...)[1])

    def apply(values: Params, x: jax.Array, *, train: bool, key: PRNGKey | None) -> jax.Array:
        # Fresh copies of the variables in this trace, so the module may be reseeded here.
        state = jax.tree.map(lambda v: v, params)
        nnx.replace_by_pure_dict(state, values)
        live = nnx.merge(graph, state, jax.tree.map(lambda v: v, rest))
        if train and key is not None:
            live.train()
            nnx.reseed(live, **{stream: key for stream in streams})
        else:
            live.eval()
        return live(x)

    return Model(init, apply, per_example_loss, name or type(built).__name__)


class _LogisticRegression(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class _MLP(nn.Module):
    hidden: Sequence[int]
    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


def layer_order(model: Model, params: Params, x: jax.Array) -> list[str]:
    """The params' top-level entries (layers) in the order ``model.apply`` on a batch like ``x``
    first uses them, input side first. A pytree's dict keys come back sorted from every
    tree operation (``Dense_0`` before ``Embed_0``), so the order of the dict is no guide.

    >>> lstm = char_lstm((5,), 7)
    >>> layer_order(lstm, lstm.init(jax.random.key(0)), jnp.zeros((1, 5), jnp.int32))
    ['Embed_0', 'OptimizedLSTMCell_0', 'OptimizedLSTMCell_1', 'Dense_0']
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [path[0].key for path, _ in flat]
    abstract = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for _, leaf in flat]
    example = jax.ShapeDtypeStruct(x.shape, x.dtype)
    closed = jax.make_jaxpr(
        lambda leaves, xs: model.apply(jax.tree.unflatten(treedef, leaves), xs, train=False, key=None)
    )(abstract, example)
    position = {id(var): i for i, var in enumerate(closed.jaxpr.invars[: len(flat)])}
    order: list[str] = []
    for eqn in closed.jaxpr.eqns:
        for var in eqn.invars:
            i = position.get(id(var))
            if i is not None and names[i] not in order:
                order.append(names[i])
    return order + [name for name in dict.fromkeys(names) if name not in order]


class _FemnistCNN(nn.Module):
    num_classes: int
    channels: tuple[int, int] = (32, 64)
    dense: int = 2048
    conv: str = "xla"

    @nn.compact
    def __call__(self, x):
        convolve = convolution.conv_function(self.conv)
        for channels in self.channels:
            conv = nn.Conv(channels, (5, 5), padding="SAME", conv_general_dilated=convolve)
            x = nn.relu(conv(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense)(x))
        return nn.Dense(self.num_classes)(x)


class _CharRNN(nn.Module):
    num_classes: int
    embed: int
    hidden: int
    layers: int
    cell: type[nn.RNNCellBase]
    every_position: bool

    @nn.compact
    def __call__(self, x):
        h = nn.Embed(self.num_classes, self.embed)(x)
        for _ in range(self.layers):
            h = nn.RNN(self.cell(self.hidden))(h)
        return nn.Dense(self.num_classes)(h if self.every_position else h[:, -1])


def logistic_regression(example_shape: Sequence[int], num_classes: int) -> Model:
    """Multinomial logistic regression on flattened inputs."""
    return from_linen(_LogisticRegression(num_classes), example_shape, name="logistic_regression")


def mlp(example_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (200, 200)) -> Model:
    """A ReLU MLP on flattened inputs (W1 of the throughput benchmark: 784-200-200-62).

    Args:
      example_shape, num_classes: the data's (the config takes them from the data).
      hidden: the widths of the hidden layers, each >= 1 (empty: a linear model).
    """
    if any(width < 1 for width in hidden):
        raise ValueError(f"mlp: hidden layer sizes must be >= 1, got {list(hidden)}")
    return _widths(lambda cut: from_linen(
        _MLP(tuple(cut(width) for width in hidden), num_classes), example_shape, name="mlp"))


def femnist_cnn(example_shape: Sequence[int], num_classes: int, *, conv: str = "xla") -> Model:
    """The LEAF FEMNIST CNN (Caldas et al. 2018), for ``[H, W, C]`` images.

    Args:
      example_shape, num_classes: the data's (the config takes them from the data).
      conv: how its convolutions run (``fedjax_het.convolution``): "xla" (XLA's
        convolution) or "patches" (im2col and a matmul; a vmapped cohort's is a batched
        matmul). The same function either way, to float rounding; a run's plan picks one
        (``with_conv``).
    """
    if len(example_shape) != 3:
        raise ValueError(f"femnist_cnn needs [height, width, channels] inputs, got {example_shape}")
    convolution.conv_function(conv)  # a bad name refused here, in one line
    model = _widths(lambda cut: from_linen(
        _FemnistCNN(num_classes, (cut(32), cut(64)), cut(2048), conv), example_shape,
        name="femnist_cnn"))
    with_conv = lambda impl: femnist_cnn(example_shape, num_classes, conv=impl)
    return dataclasses.replace(model, conv=conv, with_conv=with_conv)


def _char_rnn(name: str, cell: type[nn.RNNCellBase], example_shape: Sequence[int],
              num_classes: int, embed: int, hidden: int, layers: int,
              every_position: bool) -> Model:  # fmt: skip
    if len(example_shape) != 1:
        raise ValueError(f"{name} needs [sequence_length] integer inputs, got {example_shape}")
    sizes = {"num_classes": num_classes, "embed": embed, "hidden": hidden, "layers": layers}
    for argument, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name}: {argument} must be >= 1, got {value}")
    return _widths(lambda cut: from_linen(
        _CharRNN(num_classes, cut(embed), cut(hidden), layers, cell, every_position),
        example_shape, name=name, input_dtype=jnp.int32))


def char_lstm(
    example_shape: Sequence[int],
    num_classes: int,
    *,
    embed: int = 8,
    hidden: int = 256,
    layers: int = 2,
    every_position: bool = False,
) -> Model:
    """The LEAF Shakespeare model (Caldas et al. 2018, §4; its ``stacked_lstm``).

    int32 character indices ``[batch, sequence_length]`` -> embedding of size
    ``embed`` -> ``layers`` LSTM layers of ``hidden`` units (``nn.OptimizedLSTMCell``,
    the standard LSTM equations with the gate matmuls fused) -> a dense layer on the
    last position giving ``[batch, num_classes]`` logits of the next character.
    ``num_classes`` is the vocabulary size, for inputs and outputs alike.

    With ``every_position`` the logits are ``[batch, sequence_length, num_classes]``, the next
    character after each prefix (same parameters), for sequence labels (Shakespeare's
    ``data.targets = "every"``, the task of FedJAX's and TFF's Shakespeare).

    Args:
      example_shape, num_classes: the data's (the config takes them from the data).
      embed: the size of each character's embedding, >= 1.
      hidden: units of each recurrent layer, >= 1.
      layers: recurrent layers, >= 1.
      every_position: logits at every position (sequence labels), not only the last.

    >>> model = char_lstm((80,), 81, hidden=16, layers=1)
    >>> params = model.init(jax.random.key(0))
    >>> model.apply(params, jnp.zeros((2, 80), jnp.int32), train=False, key=None).shape
    (2, 81)
    """
    return _char_rnn(
        "char_lstm", nn.OptimizedLSTMCell, example_shape, num_classes, embed, hidden, layers,
        every_position,
    )


def char_gru(
    example_shape: Sequence[int],
    num_classes: int,
    *,
    embed: int = 8,
    hidden: int = 256,
    layers: int = 2,
    every_position: bool = False,
) -> Model:
    """:func:`char_lstm` with GRU layers (``nn.GRUCell``) in place of the LSTM layers.

    Args:
      example_shape, num_classes: the data's (the config takes them from the data).
      embed: the size of each character's embedding, >= 1.
      hidden: units of each recurrent layer, >= 1.
      layers: recurrent layers, >= 1.
      every_position: logits at every position (sequence labels), not only the last.
    """
    return _char_rnn(
        "char_gru", nn.GRUCell, example_shape, num_classes, embed, hidden, layers, every_position
    )


ZOO: dict[str, Callable[..., Model]] = {
    "logistic_regression": logistic_regression,
    "mlp": mlp,
    "femnist_cnn": femnist_cnn,
    "char_lstm": char_lstm,
    "char_gru": char_gru,
}
