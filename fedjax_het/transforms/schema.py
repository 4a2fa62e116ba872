"""The config's optional [privacy] and [compression] tables: the options of
``privacy.options`` (DP-FedAvg) and of ``compression.from_options`` (compressed updates), each
turned into a transform of the algorithm (``privacy.private``, ``compression.compressed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedjax_het.configuring import ConfigError, guarded, optional_table, signature_keys
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.transforms import compression, privacy

DEFAULTS: dict[str, Any] = {"compression": {}, "privacy": {}}


def keys() -> dict[str, Any]:
    """The keys of [compression] and [privacy], with their types."""
    return {
        **signature_keys("compression", compression.from_options),
        **signature_keys("privacy", privacy.options),
    }


def transformed(
    config: dict[str, Any], algorithm: FederatedAlgorithm, cohort: int
) -> tuple[FederatedAlgorithm, dict[str, float] | None]:
    """``algorithm`` made private and compressed as the tables ask, and the checked privacy
    options (None: no [privacy]); both tables resolved in place."""
    private = _privacy_options(config)
    if private is not None:
        chosen = {k: v for k, v in private.items() if k != "target_epsilon"}
        algorithm = guarded(
            "privacy", lambda: privacy.private(algorithm, cohort_size=cohort, **chosen)
        )
    algorithm = _compressed(config, algorithm)
    if private is not None and config.get("compression", {}).get("majority_vote"):
        raise ConfigError("compression.majority_vote and [privacy] do not combine: DP-FedAvg "
                          "noises a sum of clipped updates, not a vote")  # fmt: skip
    return algorithm, private


def _privacy_options(config: dict[str, Any]) -> dict[str, float] | None:
    """The optional [privacy] table, checked (``privacy.options``)."""
    args = optional_table(config, "privacy", privacy.options)
    return None if args is None else guarded("privacy", lambda: privacy.options(**args))


def _compressed(config: dict[str, Any], algorithm: FederatedAlgorithm) -> FederatedAlgorithm:
    """``algorithm`` with the optional [compression] table's encodings (``compression.compressed``)."""
    args = optional_table(config, "compression", compression.from_options)
    if args is None:
        return algorithm
    upload, download, vote = guarded("compression", lambda: compression.from_options(**args))
    return guarded(
        "compression",
        lambda: compression.compressed(
            algorithm, upload=upload, download=download, majority_vote=vote
        ),
    )


def rounds_within_budget(
    private: Mapping[str, float], rounds: int, cohort: int, clients: int
) -> int:
    """``rounds``, cut to the last round within ``privacy.target_epsilon`` (the run stops
    there); ``rounds`` itself when no target is set."""
    if private["target_epsilon"] <= 0:
        return rounds
    allowed = privacy.rounds_within(
        private["target_epsilon"],
        private["noise_multiplier"],
        cohort,
        clients,
        private["delta"],
        most=rounds,
    )
    if allowed == 0:
        raise ConfigError(
            f"privacy.target_epsilon = {private['target_epsilon']} at delta {private['delta']}: "
            f"not one round fits at noise_multiplier {private['noise_multiplier']} with "
            f"{cohort} of {clients} clients a round"
        )
    return allowed
