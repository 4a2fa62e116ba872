"""GANDALF rebalancing: label-mix groups, augmentation counts, synthetic rows in the flat store.

Chou, Chang and Chou, "A GAN-based Data Augmentation Framework for Federated
Learning on Non-IID Data" (GANDALF; notes: dace-gandalf-freezefl §B.1, paper
§4.1-4.2, Algorithm 2 and Fig. 4). Three steps, each usable alone:

1. :func:`label_groups`: K-Means on the clients' class distributions into
   ``M_g`` groups (Algorithm 2); each group trains one GAN
   (``fedjax_het.gandalf.gan.train_sequential``), whose class mix is the group's
   pooled label mix (:func:`group_mix`; the paper assumes a GAN generates its
   training data's class distribution).
2. :func:`augmentation_counts`: for client ``k`` with class counts ``n``,

       H = max_c n_c - n            (what each class lacks to reach uniform; Fig. 4)
       B = tau * pinv(A) H          (A [C, J]: class mixes of the client's J GANs)

   GAN ``j`` makes ``round(A[c, j] * B_j)`` rows of class ``c``. Per class
   the target is ``round(tau * H_c)``: GAN rows beyond it are dropped (the
   paper's "delete the redundant generated data"), and static augmentation
   fills what is left, at most twice the client's source rows of that class.
3. :func:`augment`: lays each client's GAN and static rows after its real
   rows in the flat store, with a per-row origin.

The generator is a hook, :data:`Generator` ``(key, labels [n]) -> features
[n, ...]``: a trained WGAN-GP (``gan.generators``), any other conditional
generator, or none (``gan_mix=None`` and ``generators=None``: static
augmentation only).

Decisions where the paper is silent:

- ``H`` is measured against the client's largest class (Fig. 4: 4 hearts,
  2 stars, no triangle give ``H = [0, 2, 4]``), and ``tau`` scales the target
  ``H`` as well as ``B`` (the paper scales ``B``; the static top-up then
  stops at the same scaled lack). Negative entries of ``B`` are clipped to 0.
- The ``J <= M_g`` GANs a client receives are those whose class mix ``a_j``
  is farthest from the client's mix ``p`` in ``KL(a_j || p)`` (the paper:
  "the larger the value, the more likely the GAN model generates the data
  that the client lacks"); ``p`` is mixed with 1e-3 of the uniform
  distribution so that missing classes give a finite divergence. Ties go to
  the lower GAN index. The per-class trim drops the least preferred GAN's rows first.
- Static augmentation ("traditional" augmentation in the paper) is resampling:
  a client's rows of class ``c`` in a random order, cycled, so each source row
  is copied at most twice (the 2x cap, applied per class: a class the client
  does not hold gets no static rows). No image transform (flip, crop) is
  applied, since features may be flat or non-image.
- K-Means (Algorithm 2) restarts until the group sizes differ by less than
  ``M_g``; here it runs ``tries`` seeded k-means++ restarts and keeps, among
  those, a balanced one of least inertia (else the most balanced).

``FederatedData``/``ClientArrays`` have no per-row field, so :func:`augment`
returns the row origins next to the data (:class:`Augmented`).

>>> import numpy as np
>>> counts = augmentation_counts(np.array([[4, 2, 0]]), np.array([[0., 1., 0.], [0., 0., 1.]]),
...                              tau=1.0)
>>> counts.gan[0].tolist()  # GAN 0 makes 2 stars, GAN 1 makes 4 triangles (Fig. 4: B = [2, 4])
[[0, 2, 0], [0, 0, 4]]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

from fedjax_het import rng
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.training import progress as progress_bar
from fedjax_het.typing import PRNGKey

Generator = Callable[[PRNGKey, np.ndarray], jax.Array]  # (key, labels [n]) -> features [n, ...]

REAL, GAN, STATIC = 0, 1, 2  # values of Augmented.origin

_UNIFORM_SHARE = 1e-3  # of the uniform distribution mixed into a client's mix for KL


def class_counts(split: ClientArrays, num_classes: int) -> np.ndarray:
    """``[num_clients, num_classes]`` number of rows of each class held by each client."""
    ids = split.client_ids.astype(np.int64)
    flat = np.bincount(ids * num_classes + split.y, minlength=split.num_clients * num_classes)
    return flat.reshape(split.num_clients, num_classes)


def _check_counts(class_counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(class_counts)
    if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
        raise ValueError(f"class_counts must be [num_clients, num_classes], got {counts.shape}")
    if np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise ValueError("class_counts must be non-negative integers")
    if np.any(counts.sum(1) == 0):
        raise ValueError(f"clients {np.flatnonzero(counts.sum(1) == 0)[:5].tolist()} hold no rows")
    return counts.astype(np.int64)


def _mixes(counts: np.ndarray) -> np.ndarray:
    return counts / counts.sum(1, keepdims=True)


def label_groups(
    class_counts: np.ndarray, num_groups: int, seed: int, *, iters: int = 100, tries: int = 10
) -> np.ndarray:
    """``[num_clients]`` group ids from K-Means on the clients' label mixes (GANDALF Algorithm 2).

    Lloyd iterations on the rows of ``class_counts`` normalised to sum 1, from
    k-means++ seeds drawn with ``np.random.default_rng(seed)``; an emptied
    cluster restarts at the point farthest from its centre. Of ``tries``
    restarts, the kept one has group sizes differing by less than
    ``num_groups`` (the paper's balance rule) and the least squared distance
    to its centres. Groups are numbered in order of their first client.

    Args:
      class_counts: ``[N, C]`` rows of each class per client (:func:`class_counts`).
      num_groups: ``M_g >= 1``, at most the number of distinct label mixes.
      seed: seeds the k-means++ draws.
      iters: at most this many Lloyd iterations per restart.
      tries: restarts.
    """
    mix = _mixes(_check_counts(class_counts))
    if num_groups < 1:
        raise ValueError(f"num_groups (M_g) must be >= 1, got {num_groups}")
    distinct = np.unique(mix, axis=0).shape[0]
    if num_groups > distinct:
        raise ValueError(
            f"num_groups={num_groups} exceeds the {distinct} distinct label mixes of the clients"
        )
    if iters < 1 or tries < 1:
        raise ValueError(f"iters and tries must be >= 1, got {iters}, {tries}")
    draws = np.random.default_rng(seed)
    best, best_rank = None, None
    for _ in range(tries):
        groups, inertia = _lloyd(mix, num_groups, draws, iters)
        sizes = np.bincount(groups, minlength=num_groups)
        rank = (sizes.max() - sizes.min() >= num_groups, sizes.max() - sizes.min(), inertia)
        if best_rank is None or rank < best_rank:
            best, best_rank = groups, rank
    _, first = np.unique(best, return_index=True)
    renumber = np.empty(num_groups, dtype=np.int32)
    renumber[np.argsort(first)] = np.arange(num_groups)
    return renumber[best]


def _lloyd(
    points: np.ndarray, k: int, draws: np.random.Generator, iters: int
) -> tuple[np.ndarray, float]:
    centres = _kmeans_plus_plus(points, k, draws)
    groups = None
    for _ in range(iters):
        dist = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1)
        new = np.argmin(dist, axis=1)
        for empty in np.setdiff1d(np.arange(k), new):
            far = np.argmax(dist[np.arange(len(points)), new])
            new[far] = empty
            dist[far, empty] = 0.0
        if groups is not None and np.array_equal(new, groups):
            break
        groups = new
        centres = np.stack([points[groups == j].mean(0) for j in range(k)])
    inertia = float(((points - centres[groups]) ** 2).sum())
    return groups.astype(np.int32), inertia


def _kmeans_plus_plus(points: np.ndarray, k: int, draws: np.random.Generator) -> np.ndarray:
    chosen = [int(draws.integers(len(points)))]
    for _ in range(1, k):
        dist = ((points[:, None, :] - points[chosen][None]) ** 2).sum(-1).min(1)
        chosen.append(int(draws.choice(len(points), p=dist / dist.sum())))
    return points[chosen]


def group_mix(class_counts: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``[G, C]`` pooled label mix of each group: the class mix assumed of its GAN."""
    counts = _check_counts(class_counts)
    groups = np.asarray(groups)
    if groups.shape != (counts.shape[0],) or groups.min() < 0:
        raise ValueError(f"groups must be [{counts.shape[0]}] ids >= 0, got shape {groups.shape}")
    pooled = np.zeros((groups.max() + 1, counts.shape[1]), dtype=np.int64)
    np.add.at(pooled, groups, counts)
    if np.any(pooled.sum(1) == 0):
        raise ValueError("every group id from 0 to max(groups) must have a client")
    return _mixes(pooled)


@dataclasses.dataclass(frozen=True)
class AugmentationCounts:
    """Rows to add per client and class.

    Attributes:
      gan: ``[N, G, C]`` rows GAN ``g`` generates for client ``k`` of class ``c``.
      static: ``[N, C]`` rows of class ``c`` copied by static augmentation.
      target: ``[N, C]`` ``round(tau * H)``: what the client was to receive.
      chosen: ``[N, J]`` the GANs each client receives, most preferred first.
    """

    gan: np.ndarray
    static: np.ndarray
    target: np.ndarray
    chosen: np.ndarray

    @property
    def added(self) -> np.ndarray:
        """``[N, C]`` all synthetic rows per client and class."""
        return self.gan.sum(1) + self.static


def choose_gans(class_counts: np.ndarray, gan_mix: np.ndarray, num: int) -> np.ndarray:
    """``[N, num]`` the GANs of largest ``KL(a_j || p_k)`` for each client (ties: lower index)."""
    mix = _mixes(_check_counts(class_counts))
    num_classes = mix.shape[1]
    smoothed = (1.0 - _UNIFORM_SHARE) * mix + _UNIFORM_SHARE / num_classes
    a = gan_mix[None, :, :]
    log_ratio = np.log(np.where(a > 0, a, 1.0)) - np.log(smoothed[:, None, :])
    kl = np.sum(np.where(a > 0, a * log_ratio, 0.0), axis=-1)  # [N, G]
    return np.argsort(-kl, axis=1, kind="stable")[:, :num].astype(np.int32)


def augmentation_counts(
    class_counts: np.ndarray,
    gan_mix: np.ndarray | None,
    *,
    tau: float,
    gans_per_client: int | None = None,
    static_cap: float = 2.0,
) -> AugmentationCounts:
    """Rows each GAN and static augmentation add per client and class (GANDALF §4.2, Fig. 4).

    Per client: ``H = max(n) - n``, target ``T = round(tau * H)``,
    ``B = max(0, tau * pinv(A) H)`` over its chosen GANs' mixes ``A [C, J]``,
    GAN rows ``round(A * B)`` trimmed per class to ``T`` (least preferred GAN
    first), static rows ``min(T - GAN rows, floor(static_cap * n))``.
    ``round`` is half-up.

    Args:
      class_counts: ``[N, C]`` rows of each class per client.
      gan_mix: ``[G, C]`` class mix of each GAN (rows normalised here), or
        None for no GAN (static augmentation only).
      tau: degree of balancing in (0, 1] (0.5 CINIC-10, 0.07 EMNIST in the paper).
      gans_per_client: ``J``, 1 to ``G``; default all ``G``.
      static_cap: static rows of a class at most this multiple of the client's rows of it.
    """
    counts = _check_counts(class_counts)
    num_clients, num_classes = counts.shape
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    if static_cap < 0:
        raise ValueError(f"static_cap must be >= 0, got {static_cap}")
    lack = counts.max(1, keepdims=True) - counts
    target = np.floor(tau * lack + 0.5).astype(np.int64)
    if gan_mix is None:
        num_gans, chosen = 0, np.zeros((num_clients, 0), dtype=np.int32)
        gan = np.zeros((num_clients, 0, num_classes), dtype=np.int64)
    else:
        gan_mix = np.asarray(gan_mix, dtype=np.float64)
        if gan_mix.ndim != 2 or gan_mix.shape[1] != num_classes or gan_mix.shape[0] < 1:
            raise ValueError(f"gan_mix must be [num_gans, {num_classes}], got {gan_mix.shape}")
        if np.any(gan_mix < 0) or np.any(gan_mix.sum(1) <= 0):
            raise ValueError("gan_mix rows must be non-negative with a positive sum")
        gan_mix = gan_mix / gan_mix.sum(1, keepdims=True)
        num_gans = gan_mix.shape[0]
        j = num_gans if gans_per_client is None else gans_per_client
        if not 1 <= j <= num_gans:
            raise ValueError(f"gans_per_client must be in [1, {num_gans}], got {gans_per_client}")
        chosen = choose_gans(counts, gan_mix, j)
        gan = np.zeros((num_clients, num_gans, num_classes), dtype=np.int64)
        for k in range(num_clients):
            a = gan_mix[chosen[k]].T  # [C, J]
            b = np.maximum(tau * (np.linalg.pinv(a) @ lack[k]), 0.0)
            rows = np.floor(a * b[None, :] + 0.5).astype(np.int64)  # [C, J]
            for slot in reversed(range(j)):  # trim the least preferred GAN first
                excess = np.maximum(rows.sum(1) - target[k], 0)
                rows[:, slot] -= np.minimum(excess, rows[:, slot])
            gan[k, chosen[k]] = rows.T
    cap = np.floor(static_cap * counts).astype(np.int64)
    static = np.minimum(target - gan.sum(1), cap)
    return AugmentationCounts(gan=gan, static=static, target=target, chosen=chosen)


@dataclasses.dataclass(frozen=True)
class Augmented:
    """A rebalanced dataset and the origin of every training row.

    Attributes:
      data: the dataset; each client's rows are its real rows, then its GAN
        rows (GAN by GAN, class by class), then its static rows. Test split unchanged.
      origin: ``[total]`` int8 :data:`REAL`, :data:`GAN` or :data:`STATIC` per training row.
    """

    data: FederatedData
    origin: np.ndarray

    @property
    def synthetic(self) -> np.ndarray:
        """``[total]`` bool: the row was added (by a GAN or static augmentation)."""
        return self.origin != REAL


def augment(
    data: FederatedData,
    counts: AugmentationCounts,
    generators: Sequence[Generator] | None,
    *,
    key: PRNGKey,
    progress: bool = False,
) -> Augmented:
    """Adds ``counts``' synthetic rows to every client's training rows.

    GAN ``g``'s rows for client ``k`` come from
    ``generators[g](fold_in(fold_in(stream(key, "generate"), k), g), labels)``;
    static rows of client ``k`` are its rows of the class in the order of
    uniforms drawn from ``fold_in(stream(key, "static"), k)``, cycled.

    Args:
      data: the federated dataset.
      counts: from :func:`augmentation_counts` on ``class_counts(data.train, ...)``.
      generators: one per GAN of ``counts.gan``, or None when ``counts`` has no GAN rows.
      key: root key of the draws.
      progress: a bar of the clients done.
    """
    train = data.train
    num_clients, num_classes = counts.static.shape
    if counts.gan.shape[0::2] != (train.num_clients, data.num_classes) or (
        num_clients,
        num_classes,
    ) != (train.num_clients, data.num_classes):
        raise ValueError(
            f"counts are for {num_clients} clients x {num_classes} classes; data has "
            f"{train.num_clients} x {data.num_classes}"
        )
    if np.any(counts.static < 0) or np.any(counts.gan < 0):
        raise ValueError("augmentation counts must be >= 0")
    if generators is None:
        if counts.gan.sum():
            raise ValueError("counts ask for GAN rows but generators is None")
    elif len(generators) != counts.gan.shape[1]:
        raise ValueError(f"got {len(generators)} generators for {counts.gan.shape[1]} GANs")
    generate_stream, static_stream = rng.stream(key, "generate"), rng.stream(key, "static")
    classes = np.arange(num_classes)
    xs, ys, origins = [], [], []
    bar = progress_bar.bar(num_clients, desc="synthetic rows", unit="client", progress=progress)
    for k in range(num_clients):
        x_k, y_k = train.client(k)
        parts_x, parts_y = [x_k], [y_k]
        parts_origin = [np.full(len(y_k), REAL, np.int8)]
        for g in range(counts.gan.shape[1]):
            labels = np.repeat(classes, counts.gan[k, g]).astype(np.int32)
            if labels.size:
                gen_key = jax.random.fold_in(rng.client_key(generate_stream, k), g)
                made = np.asarray(generators[g](gen_key, labels))
                parts_x.append(made.reshape(labels.size, *data.example_shape).astype(train.x.dtype))
                parts_y.append(labels)
                parts_origin.append(np.full(labels.size, GAN, np.int8))
        if counts.static[k].sum():
            copies = _static_rows(y_k, counts.static[k], rng.client_key(static_stream, k))
            parts_x.append(x_k[copies])
            parts_y.append(y_k[copies])
            parts_origin.append(np.full(copies.size, STATIC, np.int8))
        xs.append(np.concatenate(parts_x))
        ys.append(np.concatenate(parts_y))
        origins.append(np.concatenate(parts_origin))
        bar.update()
    bar.close()
    augmented = ClientArrays.from_clients(xs, ys)
    return Augmented(
        data=FederatedData(augmented, data.test, data.num_classes, data.name),
        origin=np.concatenate(origins),
    )


def _static_rows(y: np.ndarray, per_class: np.ndarray, key: PRNGKey) -> np.ndarray:
    """Indices into one client's rows: ``per_class[c]`` rows of class ``c``, a shuffled cycle."""
    order = np.argsort(np.asarray(jax.random.uniform(key, (len(y),))), kind="stable")
    picked = []
    for c in np.flatnonzero(per_class):
        rows = order[y[order] == c]
        if rows.size == 0:
            raise ValueError(f"static augmentation asks for class {c}, which the client lacks")
        picked.append(rows[np.arange(per_class[c]) % rows.size])
    return np.concatenate(picked)
