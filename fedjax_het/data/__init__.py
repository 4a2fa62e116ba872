"""Federated data: the flat store, local batching, datasets and partitioners."""

from fedjax_het.data.batching import LocalWork, batch_indices
from fedjax_het.data.federated import ClientArrays, FederatedData

__all__ = ["ClientArrays", "FederatedData", "LocalWork", "batch_indices"]
