"""The config's optional [privacy] and [compression] tables: the options of
``privacy.options`` (DP-FedAvg) and of ``compression.from_options`` (compressed updates), each
turned into a transform of the algorithm (``privacy.private``, ``compression.compressed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.hooks import PayloadBytes
from fedjax_het.engine.shapes import one_client
from fedjax_het.models import Model
from fedjax_het.schema import ConfigError, Key, When, guarded, optional_table, signature_keys
from fedjax_het.transforms import compression, privacy

DEFAULTS: dict[str, Any] = {"compression": {}, "privacy": {}}


_ADAPTIVE = (When("privacy.adaptive", (True,)),)
APPLIES: dict[str, tuple[When, ...]] = {
    "compression.levels": (When("compression.upload", ("qsgd",)),),
    "compression.fraction": (When("compression.upload", ("top_k", "random_k")),),
    "compression.majority_vote": (When("compression.upload", ("sign",)),),
    "compression.error_feedback": (When("compression.upload", ("none",), unless=True),),
    "privacy.target_quantile": _ADAPTIVE,
    "privacy.clip_lr": _ADAPTIVE,
    "privacy.count_noise": _ADAPTIVE,
}
"""Where each key of [compression] and [privacy] does something (``schema.applies``)."""


TABLES: dict[str, str] = {
    "compression": "compressed updates: what clients upload and download "
    "(fedjax_het.transforms.compression)",
    "privacy": "DP-FedAvg: clipped updates and Gaussian noise, with the privacy spent "
    "(fedjax_het.transforms.privacy)",
}
"""What each table of this module configures, for ``fedjax-het config --all``."""


def keys() -> dict[str, Key]:
    """The keys of [compression] and [privacy]."""
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
    if private is not None and private["adaptive"]:
        _check_adaptive(private, cohort)
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


def _check_adaptive(private: Mapping[str, Any], cohort: int) -> None:
    """Adaptive clipping noises the clipped count too: the update's multiplier
    ``(z^-2 - (2 sigma_b)^-2)^(-1/2)`` needs ``z < 2 sigma_b`` (``privacy.private``)."""
    z, count_noise = private["noise_multiplier"], private["count_noise"]
    sigma_b = cohort / 20 if count_noise is None else count_noise
    if not z < 2 * sigma_b:
        source = ("privacy.count_noise" if count_noise is not None
                  else f"its default sampler.clients_per_round / 20 = {cohort} / 20")
        raise ConfigError(
            f"privacy.adaptive = true needs privacy.noise_multiplier below 2 x privacy.count_noise "
            f"= {2 * sigma_b:g} ({source}), got {z:g}: the clipped count's noise takes part of "
            "the budget; lower the noise multiplier or raise privacy.count_noise"
        )


def _privacy_options(config: dict[str, Any]) -> dict[str, float] | None:
    """The optional [privacy] table, checked (``privacy.options``)."""
    args = optional_table(config, "privacy", privacy.options)
    return None if args is None else guarded("privacy", lambda: privacy.options(**args))


def _compressed(config: dict[str, Any], algorithm: FederatedAlgorithm) -> FederatedAlgorithm:
    """``algorithm`` with the optional [compression] table's encodings (``compression.compressed``)."""
    args = optional_table(config, "compression", compression.from_options)
    if args is None:
        return algorithm
    if algorithm.hook(PayloadBytes) is not None:
        raise ConfigError(
            f"[compression] does not apply to algorithm.name = {config['algorithm']['name']!r}: "
            "it encodes its own uploads (its payload, as FetchSGD's Count Sketch), which the "
            "table would encode again and count as its own; remove the table"
        )
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


def budget_notes(private: Mapping[str, float], asked: int, allowed: int) -> tuple[str, ...]:
    """The line a run prints when ``privacy.target_epsilon`` cut it from ``asked`` rounds to
    ``allowed`` (``rounds_within_budget``); none when it did not."""
    if allowed >= asked:
        return ()
    note = (
        f"privacy.target_epsilon = {private['target_epsilon']:g} at delta {private['delta']:g} "
        f"allows {allowed} of the {asked} rounds asked (noise_multiplier "
        f"{private['noise_multiplier']:g}): the run stops after round {allowed}; raise "
        "privacy.noise_multiplier or the target for more"
    )
    return (note,)


def check_updates(
    config: Mapping[str, Any], algorithm: FederatedAlgorithm, model: Model, x: Any, y: Any
) -> None:
    """Refuses [compression] and [privacy] for an ``algorithm`` (as its table builds it, before
    both) whose update is not shaped like the params its clients train, the delta that both
    encode or clip (SCAFFOLD's control variates, IFCA's cluster and q-FFL's ``h_k`` travel with
    it; Ditto trains a personal model beside the global one), and [privacy] for one whose
    server update reads more than the mean of the updates (FedDyn, BiasPrompt+), which
    DP-FedAvg replaces with its noised mean. Found from one client's abstract round on
    ``model``, with examples shaped like those of ``x`` and labels like ``y`` (the training
    arrays; ``jax.eval_shape``: nothing is computed)."""
    tables = [table for table in ("compression", "privacy") if config.get(table)]
    if not tables:
        return
    _, start, update, aggregate = one_client(algorithm, model, x, y)
    name = config["algorithm"]["name"]
    if jax.tree.structure(update) != jax.tree.structure(start):
        what = "compression encodes" if tables[0] == "compression" else "DP-FedAvg clips"
        raise ConfigError(
            f"[{tables[0]}] does not apply to algorithm.name = {name!r}: its clients' update is "
            "not shaped like the params they train (it carries client state such as control "
            f"variates, or they train more than the model), and {what} such a delta only"
        )
    if "privacy" in tables and jax.tree.structure(aggregate) != jax.tree.structure(update):
        raise ConfigError(
            f"[privacy] does not apply to algorithm.name = {name!r}: its server update reads "
            "more than the mean of the client updates, and DP-FedAvg replaces that mean with "
            "a noised one"
        )
