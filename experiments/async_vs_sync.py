"""Asynchronous against synchronous FL on FLASH devices and traces, at one virtual-time budget.

FedAvg with a deadline, FedAvg waiting for all, FedBuff, FedAsync, BiasPrompt+
and TimelyFL on the same FLASH devices, links and availability traces, every method given the
same virtual-time budget (FLHetBench notes §8 item 27: accuracy against virtual hours, not
rounds). Default experiment (Fashion-MNIST subset, Dirichlet 0.5 over 100 clients, 784-200-200-10
MLP, one local epoch of batch 20 at client_lr 0.05); AI-Benchmark devices
(``system.devices = "flash"``), FLASH links and FLASH "loose" traces, the run starting at trace
time ``--start`` (hour 18 of the traces' 48 h cycle, where 20-27 % of the 100 traces are ready;
over the whole cycle 12.8 %, at hour 0 about 2 %). Work pauses while a device is not ready
(``on_unavailable = "pause"``) on both servers; synchronous rounds pick their cohort among the
ready clients and pay ``--overhead`` seconds each.

Methods (notes §4.2-4.5, §5.1, §5.7, §5.8):

* ``fedavg_deadline``: cohort ``--cohort``, late work dropped at ``--deadline`` seconds;
* ``fedavg_wait_all``: the same cohort, each round waits for its last client;
* ``fedbuff``: asynchronous server, concurrency ``--concurrency``, buffer K = ``--buffer``,
  staleness bound 5, ``1 / sqrt(1 + tau)`` weights, server_lr 1;
* ``fedasync``: the same server with K = 1, alpha 0.6, staleness bound ``--fedasync-staleness``
  (FedAsync bounds nothing, it down-weights: with K = 1 every task sees about ``concurrency``
  arrivals, and a bound of 5 discarded a third of them in a probe);
* ``biasprompt_plus``: the deadline rounds with stale tasks (late work arrives up to 5 rounds
  later, ``policy.max_staleness``), "sum" gradient surgery, server momentum 0.9;
* ``timelyfl``: the deadline rounds, each client freezing the fewest first layers that let it
  finish within the interval (= the deadline);
* ``fedbuff_same_c`` (an extra control): FedBuff at the synchronous cohort's
  concurrency (``--cohort``, K = half of it), to separate "no round barrier" from "more
  clients at work at once".

Rounds (server events for the asynchronous methods) are set per method and seed from the
schedule computed before training (``simulate.plan_run`` / ``plan_events``: the same keys as
the run, so the run's schedule is the same): the rounds whose clock stays within the budget.
TimelyFL's schedule is computed during training, so it runs 1.2x the deadline FedAvg's round
count and its curve is cut at the budget. Evaluations every ``rounds // --evals`` rounds. Within a
seed every method has the same devices, links and traces (``profiles_from_options(seed=s)``)
and the same run seed; the partition is the same for all seeds.

Usage::

    python experiments/async_vs_sync.py --quick          # 1 seed, 3 virtual minutes, < 2 min
    python experiments/async_vs_sync.py                   # 3 seeds, the full budget
    python experiments/async_vs_sync.py --report --target 0.75
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import common
import jax
import numpy as np

from fedjax_het import algorithms, rng
from fedjax_het.algorithms import optimizers
from fedjax_het.data.diagnostics import gini
from fedjax_het.front import config as config_lib
from fedjax_het.system import events, setup
from fedjax_het.system.flhetbench import participation_counts
from fedjax_het.training import simulate
from fedjax_het.training.metrics import OUTCOME_NAMES
from fedjax_het.training.options import run_options

OUT = common.RESULTS / "async_vs_sync"
METHODS = (
    "fedavg_deadline",
    "fedavg_wait_all",
    "fedbuff",
    "fedasync",
    "biasprompt_plus",
    "timelyfl",
    "fedbuff_same_c",
)
ASYNC = ("fedbuff", "fedasync", "fedbuff_same_c")
MAX_STALENESS = 5  # FedBuff's and BiasPrompt+'s bound (notes §4.4, §4.5)
TIMELYFL_HEADROOM = 1.2  # its rounds can be shorter than FedAvg's: run more, cut at the budget


def system_for(method: str, args: argparse.Namespace, profiles) -> setup.System:
    """The profiles with the round policy of ``method`` (asynchronous methods ignore it)."""
    common = {"start": args.start, "overhead": args.overhead, "on_unavailable": "pause"}
    if method == "fedavg_wait_all" or method in ASYNC:
        return setup.System(profiles, setup.policy_from_options(kind="wait_all", **common))
    stale = MAX_STALENESS if method == "biasprompt_plus" else 0
    policy = setup.policy_from_options(
        kind="deadline", deadline=args.deadline, max_staleness=stale, **common
    )
    return setup.System(profiles, policy)


def server_for(method: str, args: argparse.Namespace) -> events.AsyncServer | None:
    """The asynchronous server of ``method``, None for the synchronous ones."""
    if method not in ASYNC:
        return None
    concurrency, buffer, staleness = {
        "fedbuff": (args.concurrency, args.buffer, MAX_STALENESS),
        "fedasync": (args.concurrency, 1, args.fedasync_staleness),
        "fedbuff_same_c": (args.cohort, max(1, args.cohort // 2), MAX_STALENESS),
    }[method]
    return events.async_server(
        concurrency=concurrency,
        buffer_size=buffer,
        max_staleness=staleness,
        start=args.start,
        on_unavailable="pause",
    )


def algorithm_for(method: str, args: argparse.Namespace):
    """``method``'s algorithm at the default experiment's client learning rate."""
    lr = args.client_lr
    if method in ("fedbuff", "fedbuff_same_c"):
        return algorithms.fedbuff(client_lr=lr)
    if method == "fedasync":
        return algorithms.fedasync(client_lr=lr, alpha=args.alpha)
    if method == "biasprompt_plus":
        return algorithms.biasprompt_plus(
            aggregation="sum", max_staleness=MAX_STALENESS, client_lr=lr
        )
    if method == "timelyfl":
        return algorithms.timelyfl(interval=args.deadline, client_lr=lr)
    return algorithms.fedavg(client_optimizer=optimizers.sgd("client", lr=lr))


def rounds_within(system: setup.System, server, exp, spec, seed: int, budget_s: float) -> int:
    """Rounds (events, with ``server``) of the run's schedule that end within ``budget_s``
    virtual seconds (the schedule ``simulate.run`` computes with the same seed)."""
    key, probe = rng.seed_key(seed), 256
    while True:
        if server is not None:
            plans = simulate.plan_events(system, exp.data, spec, server, events=probe, key=key)
        else:
            plans = simulate.plan_run(system, exp.data, spec, exp.sampler, rounds=probe, key=key)
        elapsed = np.asarray(plans.clock, np.float64) - run_start(system, server)
        if elapsed[-1] > budget_s or bool(np.asarray(getattr(plans, "stalled", False)).any()):
            return max(1, int(np.sum(elapsed <= budget_s)))
        probe = int(probe * 1.2 * budget_s / max(elapsed[-1], 1.0)) + 1


def run_start(system: setup.System, server) -> float:
    """The trace time the run starts at (the server's or the round policy's)."""
    return float(server.start if server is not None else system.policy.start)


def run_method(method: str, seed: int, exp, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``method`` on seed ``seed``'s devices and traces, cut at the budget."""
    budget_s = args.hours * 3600.0
    profiles = setup.profiles_from_options(
        exp.data.num_clients,
        devices="flash",
        network="flash",
        availability=args.availability,
        seed=seed,
    )
    system, server = system_for(method, args, profiles), server_for(method, args)
    algorithm = algorithm_for(method, args)
    if method == "timelyfl":  # its schedule follows the training: the deadline FedAvg's count
        spec = simulate.local_spec(
            exp.model, algorithm_for("fedavg_deadline", args), exp.data, exp.work
        )
        planned = rounds_within(system, None, exp, spec, seed, budget_s)
        rounds = int(np.ceil(TIMELYFL_HEADROOM * planned))
    else:
        spec = simulate.local_spec(exp.model, algorithm, exp.data, exp.work)
        rounds = rounds_within(system, server, exp, spec, seed, budget_s)
    eval_every = max(1, rounds // args.evals)
    started = time.perf_counter()
    h = simulate.run(
        exp.data,
        *run_options(
            model=exp.model,
            algorithm=algorithm,
            sampler=exp.sampler,
            rounds=rounds,
            work=exp.work,
            seed=seed,
            eval_every=eval_every,
            progress=False,
            system=system,
            server=server,
        ),
    )
    wall = time.perf_counter() - started
    curve = [  # round 0's line has no virtual_s
        {
            "round": m["round"],
            "virtual_h": m.get("virtual_s", 0.0) / 3600.0,
            "acc": m["test_accuracy"],
            "bytes": m.get("bytes_down", 0.0) + m.get("bytes_up", 0.0),
            "examples": m.get("examples_processed", 0.0),
        }
        for m in h.metrics
        if m.get("virtual_s", 0.0) <= budget_s
    ]
    s = h.summary
    in_budget = int(np.sum(h.round_metrics["clock_s"] <= budget_s))
    row = {
        "method": method,
        "seed": seed,
        "rounds": rounds,
        "rounds_in_budget": in_budget,
        "eval_every": eval_every,
        "virtual_h": min(s["virtual_s"], budget_s) / 3600.0,
        "virtual_h_run": s["virtual_s"] / 3600.0,
        "final_acc": curve[-1]["acc"],
        "best_acc": max(c["acc"] for c in curve),
        "participation_gini": s["participation_gini"],
        "clients_never_participated": s["clients_never_participated"],
        "wall_s": round(wall, 1),
        "curve": curve,
    }
    if server is not None:
        row.update(
            {
                k: s[k]
                for k in (
                    "applied",
                    "discarded",
                    "dropped",
                    "mean_in_flight",
                    "staleness_histogram",
                    "staleness_mean",
                )
            }
        )
    else:  # TimelyFL runs past the budget: count its rounds within it only
        within = jax.tree.map(lambda a: a[:in_budget], h.schedule)
        participation = np.asarray(participation_counts(within, exp.data.num_clients))
        row["participation_gini"] = gini(participation)
        row["clients_never_participated"] = int(np.sum(participation == 0))
        outcome = np.where(np.asarray(within.valid), np.asarray(within.outcome), -1)
        row["outcomes"] = {k: int(np.sum(outcome == code)) for code, k in enumerate(OUTCOME_NAMES)}
    return row


def main(args: argparse.Namespace) -> None:
    path = common.out_dir(args.out) / "results.json"
    old = json.loads(path.read_text()) if args.resume and path.exists() else None
    result = old or common.record(args, runs=[])
    done = {(r["method"], r["seed"]) for r in result["runs"]}
    exp = config_lib.build(config_lib.load(None, [f"sampler.clients_per_round={args.cohort}"]))
    start = time.perf_counter()
    for seed in args.seeds:
        for method in args.methods:
            if (method, seed) in done:
                continue
            row = run_method(method, seed, exp, args)
            result["runs"].append(row)
            common.write_json(path, result)
            print(
                f"[{time.perf_counter() - start:6.0f} s] seed {seed} {method:16s} "
                f"rounds {row['rounds']:5d}  final {row['final_acc']:.3f}  "
                f"best {row['best_acc']:.3f}  gini {row['participation_gini']:.2f}  "
                f"wall {row['wall_s']:.0f} s",
                flush=True,
            )
    result["wall_s_total"] = round(result.get("wall_s_total", 0.0) + time.perf_counter() - start, 1)
    common.write_json(path, result)
    report(path.parent, args.target)


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """``mean [min-max]`` of ``values``."""
    return common.spread(common.mean_min_max(values), fmt)


def to_target(runs: list[dict[str, Any]], target: float) -> list[str]:
    """Virtual hours, GB (up + down) and thousands of examples trained at the first evaluation
    reaching ``target``: mean [min-max] over the seeds that reached it."""
    hits = [h for h in (common.first_hit(r, target) for r in runs) if h is not None]
    if not hits:
        return ["not reached"] * 3
    part = "" if len(hits) == len(runs) else f" ({len(hits)}/{len(runs)} seeds)"
    return [
        spread([h["virtual_h"] for h in hits], "{:.2f}") + part,
        f"{np.mean([h['bytes'] for h in hits]) / 1e9:.2f}",
        f"{np.mean([h['examples'] for h in hits]) / 1e3:.0f}",
    ]


def report(out: Path, target: float) -> None:
    """Prints the Markdown table (mean [min-max] over seeds) and draws ``accuracy_hours.png``."""
    result = json.loads((out / "results.json").read_text())
    by_method = common.group_by(result["runs"], lambda r: r["method"])
    head = [
        "method", "seeds", "rounds (events) in budget", "final acc", "best acc",
        f"hours to {target}", f"GB to {target}", f"k examples to {target}",
        "updates aggregated", "late (sync) / discarded (async)", "participation Gini",
        "never aggregated", "mean in flight", "mean staleness",
    ]  # fmt: skip
    print("\n| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
    mean = lambda runs, key: f"{np.mean([r[key] for r in runs]):.0f}"
    for method in METHODS:
        runs = by_method.get(method)
        if not runs:
            continue
        if method in ASYNC:
            counts = [mean(runs, "applied"), mean(runs, "discarded")]
            extra = [f"{np.mean([r['mean_in_flight'] for r in runs]):.1f}",
                     f"{np.mean([r['staleness_mean'] for r in runs]):.2f}"]  # fmt: skip
        else:
            counts = [f"{np.mean([r['outcomes'][k] for r in runs]):.0f}" for k in ("ok", "late")]
            extra = ["-", "-"]
        cols = [
            method,
            len(runs),
            "/".join(str(r["rounds_in_budget"]) for r in runs),
            spread([r["final_acc"] for r in runs]),
            spread([r["best_acc"] for r in runs]),
            *to_target(runs, target),
            *counts,
            spread([r["participation_gini"] for r in runs], "{:.2f}"),
            mean(runs, "clients_never_participated"),
            *extra,
        ]
        print("| " + " | ".join(map(str, cols)) + " |")
    print(f"\nbudget {result['args']['hours']} virtual h; runs {result['wall_s_total']:.0f} s wall")
    plot(by_method, result["args"]["hours"], target, out / "accuracy_hours.png")


def on_grid(run: dict[str, Any], grid: np.ndarray) -> np.ndarray:
    """The accuracy of ``run`` at each time of ``grid``: its last evaluation at or before it."""
    times = np.array([c["virtual_h"] for c in run["curve"]])
    acc = np.array([c["acc"] for c in run["curve"]])
    return acc[np.maximum(np.searchsorted(times, grid, side="right") - 1, 0)]


def plot(
    by_method: dict[str, list[dict[str, Any]]], hours: float, target: float, path: Path
) -> None:
    with common.figure(path, ncols=2, figsize=(13, 4.8)) as (fig, axes):
        for ax, until in zip(axes, (hours, hours / 4)):  # the whole budget, and its first quarter
            grid = np.linspace(0.0, until, 400)
            for method in METHODS:
                runs = by_method.get(method)
                if not runs:
                    continue
                acc = np.array([on_grid(r, grid) for r in runs])
                style = "--" if method in ASYNC else "-"
                label = f"{method} ({len(runs)} seeds)"
                (line,) = ax.plot(grid, acc.mean(axis=0), style, label=label)
                band = (acc.min(axis=0), acc.max(axis=0))
                ax.fill_between(grid, *band, color=line.get_color(), alpha=0.15, lw=0)
            ax.axhline(target, color="grey", lw=0.8, ls=":", label=f"target {target}")
            ax.set_xlabel("virtual time (hours)")
            ax.set_ylim(bottom=0.3)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("test accuracy (mean; band: min-max over seeds)")
        axes[1].legend(fontsize=8, loc="lower right")
        fig.suptitle(
            "Fashion-MNIST MLP, 100 clients, FLASH devices, links and loose traces, "
            f"{hours:g} virtual h each (right: the first {hours / 4:g} h)"
        )


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 seed, --quick-hours of virtual time, its own out dir",
    )
    parser.add_argument("--hours", type=float, default=1.0, help="virtual-time budget per run")
    parser.add_argument("--quick-hours", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--evals", type=int, default=40, help="evaluations per run (about)")
    parser.add_argument("--target", type=float, default=0.75, help="accuracy of 'hours to'")
    parser.add_argument("--availability", default="loose", choices=("loose", "strict"))
    parser.add_argument(
        "--start", type=float, default=18 * 3600.0, help="trace time (s) the runs start at"
    )
    parser.add_argument("--overhead", type=float, default=5.0, help="seconds per sync round")
    parser.add_argument("--cohort", type=int, default=10, help="sync clients a round (fixed)")
    parser.add_argument("--deadline", type=float, default=10.0, help="sync deadline = interval")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--buffer", type=int, default=10, help="FedBuff's K")
    parser.add_argument("--fedasync-staleness", type=int, default=40)
    parser.add_argument("--alpha", type=float, default=0.6, help="FedAsync's mixing weight")
    parser.add_argument("--client-lr", type=float, default=0.05)
    common.add_output_flags(parser, OUT, resume=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.hours, args.evals = args.seeds[:1], args.quick_hours, 5
        args.out = str(Path(args.out) / "quick") if args.out == str(OUT) else args.out
    return args


if __name__ == "__main__":
    common.main_or_report(parse, main, report, "target")
