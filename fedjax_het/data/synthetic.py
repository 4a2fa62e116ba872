"""LEAF's Synthetic(alpha, beta) federated dataset, generated client by client.

The generator is the one of Li et al., "Federated Optimization in Heterogeneous Networks"
(FedProx, MLSys 2020), §5.1, which LEAF (Caldas et al., "LEAF: A Benchmark for Federated
Settings", 2018) ships as its synthetic dataset. For client k:

    u_k ~ N(0, alpha),  B_k ~ N(0, beta)
    W_k in R^{C x d}, entries ~ N(u_k, 1);  b_k in R^C, entries ~ N(u_k, 1)
    v_k in R^d, entries ~ N(B_k, 1)
    x ~ N(v_k, Sigma),  Sigma diagonal with Sigma_jj = j^{-1.2}  (j = 1..d)
    y = argmax(softmax(W_k x + b_k))

As in FedProx's code, alpha and beta are standard deviations. Because u_k adds the same amount
to every logit of client k, alpha does not change any label: the data of Synthetic(alpha, beta)
does not depend on alpha (with a fixed seed, the examples are identical for every alpha). Label
heterogeneity across clients comes from beta, which spreads the feature means v_k, and from the
independent N(0, 1) noise in every client's W_k and b_k.

Synthetic IID (``iid=True``, FedProx §5.1) shares one W, b ~ N(0, 1) across clients and gives
every client the feature mean v_k = 0; it is the alpha = beta = 0 variant.

Client sizes are ``min_size + round(lognormal(size_mean, size_sigma))``. FedProx's paper calls
them power law; its code draws ``int(lognormal(4, 2)) + 50``. The defaults here (4, 1, 10) give a
median of about 65 examples and a 99th percentile of about 570; pass ``size_sigma=2.0,
min_size=50`` for FedProx's much heavier tail.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SyntheticClients:
    """Per-client train and test arrays.

    Attributes:
      train_x: per client, float32 ``[n_train_k, num_features]``.
      train_y: per client, int32 ``[n_train_k]`` labels in ``[0, num_classes)``.
      test_x: per client, float32 ``[n_test_k, num_features]``, drawn like the client's train_x.
      test_y: per client, int32 ``[n_test_k]``.
    """

    train_x: list[np.ndarray]
    train_y: list[np.ndarray]
    test_x: list[np.ndarray]
    test_y: list[np.ndarray]

    @property
    def num_clients(self) -> int:
        return len(self.train_x)


def leaf_synthetic(
    num_clients: int,
    *,
    alpha: float,
    beta: float,
    seed: int,
    num_features: int = 60,
    num_classes: int = 10,
    test_fraction: float = 0.2,
    size_mean: float = 4.0,
    size_sigma: float = 1.0,
    min_size: int = 10,
    iid: bool = False,
) -> SyntheticClients:
    """Generates Synthetic(alpha, beta) for ``num_clients`` clients (see the module docstring).

    Args:
      num_clients: number of clients, >= 1.
      alpha: standard deviation of the per-client model means u_k, >= 0. It does not change the
        data (module docstring); it is kept for naming fidelity with FedProx and LEAF.
      beta: standard deviation of the per-client feature-mean centres B_k, >= 0.
      seed: seed of ``np.random.default_rng``.
      num_features: d, the feature dimension.
      num_classes: C, the number of classes, >= 2.
      test_fraction: share of each client's examples held out as its test split, in (0, 1);
        rounded, and at least one test and one training example per client.
      size_mean: mean of the log of the log-normal part of the client sizes.
      size_sigma: standard deviation of the log of the log-normal part, >= 0.
      min_size: examples every client has on top of the log-normal part, >= 2.
      iid: Synthetic IID: one W, b for all clients and feature mean 0; needs alpha = beta = 0.

    Returns:
      The clients' train and test arrays.
    """
    check_arguments(
        num_clients,
        alpha,
        beta,
        num_features,
        num_classes,
        test_fraction,
        size_sigma,
        min_size,
        iid,
    )
    rng = np.random.default_rng(seed)
    sizes = min_size + np.rint(rng.lognormal(size_mean, size_sigma, num_clients)).astype(np.int64)
    model_means = alpha * rng.standard_normal(num_clients)
    feature_mean_centres = beta * rng.standard_normal(num_clients)
    feature_std = np.arange(1, num_features + 1, dtype=np.float64) ** -0.6
    if iid:
        shared_weights = rng.standard_normal((num_classes, num_features))
        shared_bias = rng.standard_normal(num_classes)

    train_x, train_y, test_x, test_y = [], [], [], []
    for k in range(num_clients):
        if iid:
            weights, bias, feature_mean = shared_weights, shared_bias, np.zeros(num_features)
        else:
            weights = rng.normal(model_means[k], 1.0, (num_classes, num_features))
            bias = rng.normal(model_means[k], 1.0, num_classes)
            feature_mean = rng.normal(feature_mean_centres[k], 1.0, num_features)
        noise = rng.standard_normal((sizes[k], num_features))
        x = (feature_mean + feature_std * noise).astype(np.float32)
        y = np.argmax(x.astype(np.float64) @ weights.T + bias, axis=1).astype(np.int32)
        num_test = min(int(sizes[k]) - 1, max(1, round(test_fraction * int(sizes[k]))))
        num_train = int(sizes[k]) - num_test
        train_x.append(x[:num_train])
        train_y.append(y[:num_train])
        test_x.append(x[num_train:])
        test_y.append(y[num_train:])
    return SyntheticClients(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)


def check_arguments(
    num_clients: int,
    alpha: float,
    beta: float,
    num_features: int,
    num_classes: int,
    test_fraction: float,
    size_sigma: float,
    min_size: int,
    iid: bool,
) -> None:
    """A one-line ``ValueError`` naming the first bad argument of ``leaf_synthetic``."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    for name, value in (("alpha", alpha), ("beta", beta), ("size_sigma", size_sigma)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if min_size < 2:
        raise ValueError(f"min_size must be >= 2 (one train and one test example), got {min_size}")
    if iid and (alpha != 0 or beta != 0):
        raise ValueError(
            f"iid=True is the alpha = beta = 0 variant; got alpha={alpha}, beta={beta}"
        )
