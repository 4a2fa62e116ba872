"""The config's [sampler], [system], [policy], [server] and [selection] tables: who is
selected, on which devices, how a round ends, and which server runs them.

``[sampler]`` names a registered client-selection rule and the cohort size; ``[system]`` takes
the options of ``setup.profiles_from_options`` (device and state heterogeneity), ``[policy]``
those of ``setup.policy_from_options``; ``[server]`` those of ``events.server_from_options``
(the asynchronous server); ``[selection]`` names a registered selection that learns, with its
options. The last four are optional; neither [system] nor [policy] means no heterogeneity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedjax_het import registry
from fedjax_het.schema import (
    ConfigError,
    Key,
    When,
    arguments,
    check,
    guarded,
    registered,
    resolved,
    signature_keys,
    unknown,
)
from fedjax_het.system import events, setup
from fedjax_het.system.policy import RoundPolicy, num_selected
from fedjax_het.system.sampler import Sampler

SAMPLER = {
    "name": Key(str, "uniform", "the registered rule that draws each round's cohort"),
    "clients_per_round": Key(
        int, 10, "the cohort: clients selected each round, at most data.num_clients", minimum=1
    ),
}
DEFAULTS: dict[str, Any] = {
    "sampler": {k: key.default for k, key in SAMPLER.items()},
    "system": {},
    "policy": {},
    "selection": {},
    "server": {},
}
UNBOUNDED: dict[str, str] = {"system.bandwidth": "transfers take no time"}
"""The options of these tables for which ``inf`` means something, and what."""
PROFILE_SKIP = ("num_clients",)  # given by the data
SERVER_SKIP = ("start", "on_unavailable")  # given by the [policy]
SELECTION_SKIP = ("num_clients", "num_slots")  # given by the data and the cohort

SystemOptions = tuple[dict[str, Any], RoundPolicy]  # the profile options, the policy
Selection = tuple[Callable, dict[str, Any]]  # a learned selection's factory, its options


_SYNC = When("server.mode", ("sync",))  # the asynchronous server runs whole tasks, no rounds
_TRACES = ("strict", "loose", "*.csv")
APPLIES: dict[str, tuple[When, ...]] = {
    "system.step_time_sigma": (When("system.devices", ("lognormal",)),),
    "system.device_sampler": (When("system.devices", ("flash",)),),
    "system.device_level": (When("system.device_sampler", ("random",), unless=True),),
    "system.bandwidth": (When("system.network", ("uniform",)),),
    "system.availability_p": (When("system.availability", ("bernoulli",)),),
    "system.availability_slots": (When("system.availability", ("bernoulli",)),),
    "system.availability_period": (When("system.availability", ("bernoulli", "*.csv")),),
    "system.min_interval": (When("system.availability", _TRACES),),
    "system.state_sampler": (When("system.availability", ("strict", "loose")),),
    "system.state_level": (When("system.state_sampler", ("random",), unless=True),),
    "policy.kind": (_SYNC,),
    "policy.deadline": (When("policy.kind", ("deadline",)), _SYNC),
    "policy.on_late": (When("policy.kind", ("deadline",)), _SYNC),
    "policy.readiness": (When("policy.kind", ("readiness",)), _SYNC),
    "policy.over_commit": (_SYNC,),
    "server.concurrency": (When("server.mode", ("async",)),),
    "server.buffer_size": (When("server.mode", ("async",)),),
    "server.max_staleness": (When("server.mode", ("async",)),),
}
"""Where each key of [system], [policy] and [server] does something (``schema.applies``): a
key set where it does nothing is refused."""


TABLES: dict[str, str] = {
    "sampler": "who takes part in each round (fedjax_het.system.sampler)",
    "system": "device and state heterogeneity: the clients' speeds, networks and "
    "availability (fedjax_het.system.setup)",
    "policy": "how a round runs on those devices: wait for all, a deadline, or readiness",
    "selection": "a selection that learns which clients to pick; needs [system] or [policy]",
    "server": "the server: synchronous rounds, or asynchronous server events (FedBuff); "
    "async needs [system] or [policy]",
}
"""What each table of this module configures, for ``fedjax-het config --all``."""


def keys(config: Mapping[str, Any]) -> dict[str, Key]:
    """The keys of these tables as ``config`` chooses them (``selection.name``); [system] and
    [policy] are listed whether or not ``config`` has them."""
    out: dict[str, Key] = {}
    if config.get("sampler"):
        out["sampler.name"] = SAMPLER["name"]._replace(choices=tuple(registry.names("sampler")))
    out["sampler.clients_per_round"] = SAMPLER["clients_per_round"]
    out.update(signature_keys("system", setup.profiles_from_options, PROFILE_SKIP))
    out.update(signature_keys("policy", setup.policy_from_options))
    out.update(signature_keys("server", events.server_from_options, SERVER_SKIP))
    doc = "the registered selection that learns; each takes its own options"
    out["selection.name"] = Key(str, ..., doc, choices=tuple(registry.names("selection")))
    if config.get("selection"):
        factory = registered("selection", config["selection"].get("name"))
        out.update(signature_keys("selection", factory, SELECTION_SKIP))
    return out


def sampler(config: Mapping[str, Any], num_clients: int | None) -> tuple[Callable, int]:
    """The sampler factory and cohort size; checked against ``num_clients`` when it is known."""
    table = dict(config["sampler"])
    factory = registered("sampler", table.pop("name", None))
    default = SAMPLER["clients_per_round"].default
    cohort = check("sampler.clients_per_round", table.pop("clients_per_round", default), int)
    for key in table:
        raise ConfigError(unknown("key", f"sampler.{key}", {f"sampler.{k}": 0 for k in SAMPLER}))
    if cohort < SAMPLER["clients_per_round"].minimum or (
        num_clients is not None and cohort > num_clients
    ):
        raise ConfigError(
            f"sampler.clients_per_round must be between 1 and data.num_clients={num_clients}, "
            f"got {cohort}"
        )
    return factory, cohort


def system_options(config: dict[str, Any]) -> SystemOptions | None:
    """The [system] and [policy] tables, checked without the data: the profile options and
    the policy. Neither table given means no system heterogeneity (None)."""
    tables = {name: dict(config.get(name) or {}) for name in ("system", "policy")}
    if not any(tables.values()):
        for name in tables:
            config.pop(name, None)
        return None
    profile_args = setup.absolute_paths(
        arguments("system", setup.profiles_from_options, tables["system"], PROFILE_SKIP, UNBOUNDED)
    )
    guarded("system", lambda: setup.check_profile_options(**profile_args))
    policy_args = arguments("policy", setup.policy_from_options, tables["policy"])
    config["system"] = resolved(profile_args, setup.profiles_from_options, PROFILE_SKIP)
    config["policy"] = resolved(policy_args, setup.policy_from_options)
    return profile_args, guarded("policy", lambda: setup.policy_from_options(**policy_args))


def selection_options(config: dict[str, Any], *, has_system: bool) -> Selection | None:
    """The optional [selection] table, checked: a learned selection's factory and options."""
    table = dict(config.get("selection") or {})
    if not table:
        config.pop("selection", None)
        return None
    if not has_system:
        raise ConfigError("selection needs a [system] (and [policy]): it selects among devices")
    name = table.pop("name", None)
    factory = registered("selection", name)
    args = arguments("selection", factory, table, SELECTION_SKIP)
    config["selection"] = {"name": name, **resolved(args, factory, SELECTION_SKIP)}
    return factory, args


def server_options(
    config: dict[str, Any],
    system: SystemOptions | None,
    *,
    algorithm: str,
    freezes: bool,
    learned_selection: bool,
    private: bool,
) -> events.AsyncServer | None:
    """The optional [server] table, checked: an asynchronous server (with its trace start and
    unavailability rule from the [policy]), or None for the synchronous one. ``algorithm`` is
    the algorithm's name; ``freezes``: it freezes layers by device timing; ``private``: the
    config has a [privacy] table, whose accounting holds for synchronous rounds only."""
    table = dict(config.get("server") or {})
    if not table:
        config.pop("server", None)
        return None
    args = arguments("server", events.server_from_options, table, SERVER_SKIP)
    config["server"] = resolved(args, events.server_from_options, SERVER_SKIP)
    if config["server"]["mode"] == "sync":
        return guarded("server", lambda: events.server_from_options(**args))
    if system is None:
        raise ConfigError(
            "server.mode = 'async' runs on device timings: it needs a [system] (and [policy]) table"
        )
    if learned_selection or freezes:
        raise ConfigError(
            "server.mode = 'async' takes neither a [selection] nor an algorithm that freezes by "
            f"device timing ({algorithm}); run them with server.mode = 'sync'"
        )
    if private:
        raise ConfigError(
            "[privacy] and server.mode = 'async' do not combine: DP-FedAvg noises a mean over "
            "sampler.clients_per_round clients and accounts rounds of a uniform sample of them, "
            "while a server event averages the first server.buffer_size arrivals, which the "
            "devices' speeds choose; use server.mode = 'sync'"
        )
    policy = system[1]
    if policy.max_staleness:
        raise ConfigError(
            "policy.max_staleness (stale tasks of the synchronous server) and "
            "server.mode = 'async' do not combine; use server.max_staleness"
        )
    return guarded(
        "server",
        lambda: events.server_from_options(
            **args, start=float(policy.start), on_unavailable=policy.on_unavailable
        ),
    )


def check_with_data(cohort: int, server: events.AsyncServer | None, num_clients: int) -> None:
    """The cohort and the asynchronous server's concurrency against the data's clients."""
    if cohort > num_clients:
        raise ConfigError(
            f"sampler.clients_per_round must be between 1 and the {num_clients} clients of "
            f"the data, got {cohort}"
        )
    if server is not None and server.concurrency > num_clients:
        raise ConfigError(
            f"server.concurrency must be at most the {num_clients} clients of the data, got "
            f"{server.concurrency}"
        )


def build_sampler(factory: Callable, num_clients: int, cohort: int) -> Sampler:
    """The sampler of ``cohort`` clients a round among ``num_clients``."""
    return guarded("sampler", lambda: factory(num_clients, cohort))


def build_system(options: SystemOptions, num_clients: int) -> setup.System:
    """The system: the clients' device and state profiles, and the round policy."""
    profile_args, policy = options
    profiles = guarded("system", lambda: setup.profiles_from_options(num_clients, **profile_args))
    return setup.System(profiles, policy)


def build_selection(
    selection: Selection, cohort: int, system: setup.System, num_clients: int
) -> Callable:
    """The learned selection, choosing among the slots the round policy over-commits."""
    factory, args = selection
    slots = min(int(num_selected(cohort, system.policy.over_commit)), num_clients)
    return guarded("selection", lambda: factory(num_clients, slots, **args))
