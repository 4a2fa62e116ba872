"""The flat federated data store (docs/design.md §3).

All examples of all clients live in one flat array; client ``k`` owns rows
``offset[k] : offset[k] + count[k]``. Nothing is padded per client, so heavy
tailed client sizes cost only what they hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ClientArrays:
    """One split (train or test) of every client, stored flat.

    Attributes:
      x: ``[total, ...]`` features of all examples, client after client.
      y: ``[total]`` integer labels.
      offset: ``[num_clients]`` first row of each client.
      count: ``[num_clients]`` number of rows of each client.
    """

    x: np.ndarray
    y: np.ndarray
    offset: np.ndarray
    count: np.ndarray

    def __post_init__(self):
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"x has {self.x.shape[0]} examples but y has {self.y.shape[0]}; they must match"
            )
        if self.offset.shape != self.count.shape or self.offset.ndim != 1:
            raise ValueError(
                f"offset {self.offset.shape} and count {self.count.shape} must be 1-D and equal"
            )
        if np.any(self.count < 0):
            raise ValueError("client counts must be >= 0")
        end = self.offset + self.count
        if np.any(self.offset < 0) or (end.size and end.max() > self.x.shape[0]):
            raise ValueError(f"client rows run outside the {self.x.shape[0]} stored examples")

    @property
    def num_clients(self) -> int:
        return int(self.count.shape[0])

    @property
    def client_ids(self) -> np.ndarray:
        """``[total]`` owning client of every stored row."""
        return np.repeat(np.arange(self.num_clients, dtype=np.int32), self.count)

    def client(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The (x, y) rows of client ``k``."""
        start, n = int(self.offset[k]), int(self.count[k])
        return self.x[start : start + n], self.y[start : start + n]

    @classmethod
    def from_clients(cls, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> ClientArrays:
        if len(xs) != len(ys):
            raise ValueError(f"got {len(xs)} feature arrays but {len(ys)} label arrays")
        if not xs:
            raise ValueError("no clients given")
        for k, (xk, yk) in enumerate(zip(xs, ys)):
            if np.shape(xk)[0] != np.shape(yk)[0]:
                raise ValueError(
                    f"client {k}: {np.shape(xk)[0]} examples in x but {np.shape(yk)[0]} in y"
                )
        shapes = {np.shape(xk)[1:] for xk in xs}
        if len(shapes) > 1:
            raise ValueError(f"clients disagree on the example shape: {sorted(shapes)}")
        count = np.array([np.shape(yk)[0] for yk in ys], dtype=np.int32)
        offset = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int32)
        return cls(
            x=np.concatenate([np.asarray(xk) for xk in xs]),
            y=np.concatenate([np.asarray(yk) for yk in ys]).astype(np.int32),
            offset=offset,
            count=count,
        )

    @classmethod
    def from_client_ids(
        cls, x: np.ndarray, y: np.ndarray, client_id: np.ndarray, num_clients: int | None = None
    ) -> ClientArrays:
        """Groups rows by ``client_id`` (stable: rows keep their order within a client)."""
        client_id = np.asarray(client_id)
        if client_id.shape != (np.shape(y)[0],):
            raise ValueError(
                f"client_id must have shape ({np.shape(y)[0]},), one id per example; "
                f"got {client_id.shape}"
            )
        if client_id.size and client_id.min() < 0:
            raise ValueError("client ids must be >= 0")
        n = int(client_id.max()) + 1 if num_clients is None else num_clients
        order = np.argsort(client_id, kind="stable")
        count = np.bincount(client_id, minlength=n).astype(np.int32)
        if count.shape[0] != n:
            raise ValueError(f"client ids go up to {count.shape[0] - 1} but num_clients={n}")
        offset = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int32)
        return cls(x=np.asarray(x)[order], y=np.asarray(y)[order].astype(np.int32),
                   offset=offset, count=count)


@dataclasses.dataclass(frozen=True)
class FederatedData:
    """A federated dataset: per-client training rows and an optional per-client test split.

    Every client must hold at least one training example (an empty client
    cannot train and would divide by zero in weighting); test splits may be
    empty for some clients, which are then left out of per-client accuracy.

    Attributes:
      train: the clients' training examples.
      test: the clients' own test examples, or None. The global test metrics
        are computed on the union of all clients' test rows.
      num_classes: number of label values.
      name: a short name for logs.

    >>> import numpy as np
    >>> data = FederatedData.from_client_arrays(
    ...     [np.zeros((3, 2)), np.ones((5, 2))], [np.zeros(3), np.ones(5)], num_classes=2)
    >>> data.train.count.tolist(), data.train.offset.tolist()
    ([3, 5], [0, 3])
    """

    train: ClientArrays
    test: ClientArrays | None
    num_classes: int
    name: str = "data"

    def __post_init__(self):
        empty = np.flatnonzero(self.train.count == 0)
        if empty.size:
            raise ValueError(
                f"{empty.size} client(s) have no training examples (first ids: "
                f"{empty[:5].tolist()}); give every client at least one example"
            )
        if self.test is not None and self.test.num_clients != self.train.num_clients:
            raise ValueError(
                f"test split has {self.test.num_clients} clients, train has "
                f"{self.train.num_clients}"
            )
        for split in (self.train, self.test):
            if split is None or split.y.size == 0:
                continue
            if split.y.min() < 0 or split.y.max() >= self.num_classes:
                raise ValueError(
                    f"labels must lie in [0, {self.num_classes}); found "
                    f"[{split.y.min()}, {split.y.max()}]"
                )

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])

    @classmethod
    def from_client_arrays(
        cls,
        xs: Sequence[np.ndarray],
        ys: Sequence[np.ndarray],
        *,
        test_xs: Sequence[np.ndarray] | None = None,
        test_ys: Sequence[np.ndarray] | None = None,
        num_classes: int | None = None,
        name: str = "data",
    ) -> FederatedData:
        """Builds the store from one (x, y) pair of arrays per client."""
        train = ClientArrays.from_clients(xs, ys)
        test = None if test_xs is None else ClientArrays.from_clients(test_xs, test_ys)
        return cls(train, test, num_classes or _infer_classes(train, test), name)

    @classmethod
    def from_client_ids(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        client_id: np.ndarray,
        *,
        test: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        num_classes: int | None = None,
        name: str = "data",
    ) -> FederatedData:
        """Builds the store from flat arrays and a client id per example.

        ``test`` is an optional ``(x, y, client_id)`` triple for the test split.
        """
        train = ClientArrays.from_client_ids(x, y, client_id)
        test_arrays = None
        if test is not None:
            test_arrays = ClientArrays.from_client_ids(*test, num_clients=train.num_clients)
        return cls(train, test_arrays, num_classes or _infer_classes(train, test_arrays), name)


def _infer_classes(train: ClientArrays, test: ClientArrays | None) -> int:
    top = int(train.y.max())
    if test is not None and test.y.size:
        top = max(top, int(test.y.max()))
    return top + 1
