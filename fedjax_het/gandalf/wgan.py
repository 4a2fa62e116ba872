"""A small conditional WGAN-GP over flat features, and its training at one client.

The critic ``D`` and generator ``G`` follow Gulrajani et al. 2017, "Improved
Training of Wasserstein GANs", Eq. 3 and Algorithm 1:

    L_D = E[D(G(z), y)] - E[D(x, y)] + lambda * E[(||grad_xhat D(xhat, y)||_2 - 1)^2]
    xhat = gamma * x + (1 - gamma) * G(z), gamma ~ U[0, 1],  lambda = 10
    L_G = -E[D(G(z), y)]

with Adam(beta1 = 0, beta2 = 0.9) (their Algorithm 1) at the learning rates of
GANDALF (Chou, Chang and Chou, "A GAN-based Data Augmentation Framework for
Federated Learning on Non-IID Data"; notes: dace-gandalf-freezefl §B.1):
1e-4 for the critic, 5e-5 for the generator, batch 256. A visit at a client
(:meth:`WGANGP.client_visit`, GANDALF Algorithm 1, lines 5-18) is ``T_g = 3``
generator steps, each after ``T_d = 2`` critic steps, on batches of that
client's data; ``fedjax_het.gandalf.gan`` passes one GAN per group from client
to client.

Decisions where the papers are silent or differ:

- **Conditional.** GANDALF's generator is unconditional (``G(z)``); here
  ``G(z, y)`` and ``D(x, y)`` take a one-hot label concatenated to their input
  (Mirza and Osindero 2014), so a GAN makes exactly the classes
  ``rebalance.augmentation_counts`` asks of it. The gradient penalty
  differentiates with respect to ``x`` only, at the real example's label.
- **Architecture.** MLPs over flattened features, hidden widths (256, 256),
  leaky ReLU (slope 0.2), a 64-dimensional standard normal latent, no
  normalisation in the critic (WGAN-GP §4: batch norm breaks the per-example
  penalty). The generator's output is linear unless ``output`` names
  ``"sigmoid"`` (data in [0, 1], e.g. ``fashion_mnist``) or ``"tanh"``.
- **Batches** are drawn with replacement from the client's rows, so a client
  smaller than the batch still fills it; the generator's labels are drawn the
  same way (the client's label mix).
- **Privacy noise.** Algorithm 1 adds ``N(0, (sigma_n s)^2)`` to both
  networks' weights; its text says once at the end of a client's local
  training, which is what ``weight_noise`` (the std ``sigma_n * s``, default 0,
  no privacy) does. The sensitivities ``s_g``, ``s_d`` are not given.

>>> import jax, numpy as np
>>> gan = wgan_gp(features=3, num_classes=2, hidden=(8,), latent_dim=4)
>>> state = gan.init(jax.random.key(0))
>>> gan.generate(state.generator, jax.random.key(1), np.array([0, 1, 1])).shape
(3, 3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax

from fedjax_het.typing import Params, PRNGKey

_OUTPUTS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "linear": lambda h: h,
    "sigmoid": nn.sigmoid,
    "tanh": jnp.tanh,
}


class _Generator(nn.Module):
    hidden: Sequence[int]
    features: int
    output: str

    @nn.compact
    def __call__(self, z, labels_one_hot):
        h = jnp.concatenate([z, labels_one_hot], axis=-1)
        for width in self.hidden:
            h = nn.leaky_relu(nn.Dense(width)(h), 0.2)
        return _OUTPUTS[self.output](nn.Dense(self.features)(h))


class _Critic(nn.Module):
    hidden: Sequence[int]

    @nn.compact
    def __call__(self, x, labels_one_hot):
        h = jnp.concatenate([x, labels_one_hot], axis=-1)
        for width in self.hidden:
            h = nn.leaky_relu(nn.Dense(width)(h), 0.2)
        return nn.Dense(1)(h)[..., 0]


@struct.dataclass
class GANState:
    """One GAN: both networks and their Adam states (stacked ``[G, ...]`` for ``G`` groups)."""

    generator: Params
    critic: Params
    generator_opt: optax.OptState
    critic_opt: optax.OptState


@struct.dataclass
class GANMetrics:
    """What one client visit reports, from its last generator round.

    Attributes:
      wasserstein: the critic's estimate ``E[D(x)] - E[D(G(z))]`` on its last
        batch, before that batch's update.
      penalty: the mean ``(||grad D(xhat)|| - 1)^2`` on that batch (without lambda).
      generator_loss: ``-E[D(G(z))]`` before the last generator update.
    """

    wasserstein: jax.Array
    penalty: jax.Array
    generator_loss: jax.Array


def gradient_penalty(
    critic: Callable[[jax.Array, jax.Array], jax.Array], x_hat: jax.Array, labels: jax.Array
) -> jax.Array:
    """``[b]`` per-example ``(||grad_x critic(x, y)||_2 - 1)^2`` at ``x_hat`` (WGAN-GP Eq. 3).

    Args:
      critic: ``(x [F], label []) -> scalar`` for one example.
      x_hat: ``[b, F]`` points where the critic's gradient is taken.
      labels: ``[b]`` their labels (held fixed).
    """
    grads = jax.vmap(jax.grad(critic))(x_hat, labels)
    return (jnp.sqrt(jnp.sum(grads**2, axis=-1)) - 1.0) ** 2


@dataclasses.dataclass(frozen=True)
class WGANGP:
    """A conditional WGAN-GP over flat features; build it with :func:`wgan_gp`.

    Hashable and static under ``jit``: it holds only shapes and constants.
    """

    features: int
    num_classes: int
    latent_dim: int
    hidden: tuple[int, ...]
    output: str
    gp_weight: float
    critic_lr: float
    generator_lr: float
    critic_steps: int
    generator_steps: int
    weight_noise: float

    @property
    def _generator(self) -> _Generator:
        return _Generator(self.hidden, self.features, self.output)

    @property
    def _critic(self) -> _Critic:
        return _Critic(self.hidden)

    @property
    def _critic_opt(self) -> optax.GradientTransformation:
        return optax.adam(self.critic_lr, b1=0.0, b2=0.9)

    @property
    def _generator_opt(self) -> optax.GradientTransformation:
        return optax.adam(self.generator_lr, b1=0.0, b2=0.9)

    def _one_hot(self, labels: jax.Array) -> jax.Array:
        return jax.nn.one_hot(labels, self.num_classes)

    def init(self, key: PRNGKey) -> GANState:
        generator_key, critic_key = jax.random.split(key)
        one_hot = jnp.zeros((1, self.num_classes))
        generator = self._generator.init(generator_key, jnp.zeros((1, self.latent_dim)), one_hot)
        critic = self._critic.init(critic_key, jnp.zeros((1, self.features)), one_hot)
        return GANState(
            generator=generator,
            critic=critic,
            generator_opt=self._generator_opt.init(generator),
            critic_opt=self._critic_opt.init(critic),
        )

    def critic_value(self, critic: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
        """``[b]`` critic scores ``D(x, y)`` of flat examples ``x [b, F]``."""
        return self._critic.apply(critic, x, self._one_hot(labels))

    def fake(self, generator: Params, z: jax.Array, labels: jax.Array) -> jax.Array:
        """``[b, F]`` generated examples ``G(z, y)`` for latents ``z [b, latent_dim]``."""
        return self._generator.apply(generator, z, self._one_hot(labels))

    def generate(self, generator: Params, key: PRNGKey, labels: jax.Array) -> jax.Array:
        """``[n, F]`` examples of the given ``labels [n]``, latents ``z ~ N(0, I)`` from ``key``."""
        labels = jnp.asarray(labels)
        z = jax.random.normal(key, (labels.shape[0], self.latent_dim))
        return self.fake(generator, z, labels)

    def critic_loss(
        self,
        critic: Params,
        generator: Params,
        x: jax.Array,
        labels: jax.Array,
        z: jax.Array,
        gamma: jax.Array,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """WGAN-GP Eq. 3 on one batch, with its noise ``z [b, latent]``, ``gamma [b]`` given.

        Returns ``(loss, (wasserstein, penalty))``, the last two as in :class:`GANMetrics`.
        """
        fake = self.fake(generator, z, labels)
        x_hat = gamma[:, None] * x + (1.0 - gamma[:, None]) * fake

        def one_example(xi, yi):
            return self.critic_value(critic, xi[None], yi[None])[0]

        penalty = jnp.mean(gradient_penalty(one_example, x_hat, labels))
        wasserstein = jnp.mean(self.critic_value(critic, x, labels)) - jnp.mean(
            self.critic_value(critic, fake, labels)
        )
        return -wasserstein + self.gp_weight * penalty, (wasserstein, penalty)

    def generator_loss(
        self, generator: Params, critic: Params, labels: jax.Array, z: jax.Array
    ) -> jax.Array:
        """``-E[D(G(z, y), y)]`` on one batch of latents ``z`` and labels."""
        return -jnp.mean(self.critic_value(critic, self.fake(generator, z, labels), labels))

    def critic_step(
        self, state: GANState, x: jax.Array, labels: jax.Array, key: PRNGKey
    ) -> tuple[GANState, tuple[jax.Array, jax.Array]]:
        """One Adam step of the critic on a real batch ``x [b, F]``; returns its metrics."""
        z_key, gamma_key = jax.random.split(key)
        z = jax.random.normal(z_key, (x.shape[0], self.latent_dim))
        gamma = jax.random.uniform(gamma_key, (x.shape[0],))
        grads, metrics = jax.grad(self.critic_loss, has_aux=True)(
            state.critic, state.generator, x, labels, z, gamma
        )
        updates, critic_opt = self._critic_opt.update(grads, state.critic_opt, state.critic)
        critic = optax.apply_updates(state.critic, updates)
        return state.replace(critic=critic, critic_opt=critic_opt), metrics

    def generator_step(
        self, state: GANState, labels: jax.Array, key: PRNGKey
    ) -> tuple[GANState, jax.Array]:
        """One Adam step of the generator on a batch of ``labels``; returns its loss before it."""
        z = jax.random.normal(key, (labels.shape[0], self.latent_dim))
        loss, grads = jax.value_and_grad(self.generator_loss)(
            state.generator, state.critic, labels, z
        )
        updates, generator_opt = self._generator_opt.update(
            grads, state.generator_opt, state.generator
        )
        generator = optax.apply_updates(state.generator, updates)
        return state.replace(generator=generator, generator_opt=generator_opt), loss

    def client_visit(
        self,
        state: GANState,
        x: jax.Array,
        y: jax.Array,
        offset: jax.Array,
        count: jax.Array,
        key: PRNGKey,
        batch_size: int,
    ) -> tuple[GANState, GANMetrics]:
        """GANDALF Algorithm 1, lines 5-18, at the client owning rows ``offset : offset + count``.

        ``T_g`` generator steps, each after ``T_d`` critic steps, every batch
        drawn with replacement from the client's rows of the flat ``x [total, F]``.
        """

        def batch_rows(key):
            return offset + jax.random.randint(key, (batch_size,), 0, count)

        def critic_round(state, key):
            rows_key, step_key = jax.random.split(key)
            rows = batch_rows(rows_key)
            return self.critic_step(state, x[rows], y[rows], step_key)

        def generator_round(state, key):
            critic_key, rows_key, step_key = jax.random.split(key, 3)
            critic_keys = jax.random.split(critic_key, self.critic_steps)
            state, (wasserstein, penalty) = lax.scan(critic_round, state, critic_keys)
            state, loss = self.generator_step(state, y[batch_rows(rows_key)], step_key)
            return state, GANMetrics(wasserstein[-1], penalty[-1], loss)

        round_key, noise_key = jax.random.split(key)
        round_keys = jax.random.split(round_key, self.generator_steps)
        state, metrics = lax.scan(generator_round, state, round_keys)
        if self.weight_noise > 0:
            state = state.replace(
                generator=_add_noise(state.generator, noise_key, self.weight_noise),
                critic=_add_noise(
                    state.critic, jax.random.fold_in(noise_key, 1), self.weight_noise
                ),
            )
        return state, jax.tree.map(lambda m: m[-1], metrics)


def _add_noise(params: Params, key: PRNGKey, std: float) -> Params:
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    noisy = [
        leaf + std * jax.random.normal(k, leaf.shape, leaf.dtype) for leaf, k in zip(leaves, keys)
    ]
    return jax.tree.unflatten(treedef, noisy)


def wgan_gp(
    features: int,
    num_classes: int,
    *,
    latent_dim: int = 64,
    hidden: Sequence[int] = (256, 256),
    output: str = "linear",
    gp_weight: float = 10.0,
    critic_lr: float = 1e-4,
    generator_lr: float = 5e-5,
    critic_steps: int = 2,
    generator_steps: int = 3,
    weight_noise: float = 0.0,
) -> WGANGP:
    """A conditional WGAN-GP for ``features``-long flat examples of ``num_classes`` labels.

    Defaults: lambda = 10 (WGAN-GP), critic/generator learning rates 1e-4/5e-5
    and ``critic_steps = T_d = 2``, ``generator_steps = T_g = 3`` (GANDALF §5.1).
    """
    for name, value in (
        ("features", features),
        ("num_classes", num_classes),
        ("latent_dim", latent_dim),
        ("critic_steps", critic_steps),
        ("generator_steps", generator_steps),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {sorted(_OUTPUTS)}, got {output!r}")
    if any(width < 1 for width in hidden):
        raise ValueError(f"hidden widths must be >= 1, got {tuple(hidden)}")
    for name, value in (("critic_lr", critic_lr), ("generator_lr", generator_lr)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if gp_weight < 0 or weight_noise < 0:
        raise ValueError(
            f"gp_weight and weight_noise must be >= 0, got {gp_weight}, {weight_noise}"
        )
    return WGANGP(
        features=int(features),
        num_classes=int(num_classes),
        latent_dim=int(latent_dim),
        hidden=tuple(int(w) for w in hidden),
        output=output,
        gp_weight=float(gp_weight),
        critic_lr=float(critic_lr),
        generator_lr=float(generator_lr),
        critic_steps=int(critic_steps),
        generator_steps=int(generator_steps),
        weight_noise=float(weight_noise),
    )
