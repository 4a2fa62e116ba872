"""HDFL against FedAvg, LS-FL and Oort in HDFL's three set-ups: error, fairness, cost and time.

Zawad, Anwar, Baracaldo, Zhou and Yan, "HDFL: A Heterogeneity and Client Dropout-Aware
Federated Learning Framework". The paper's claim (its abstract and evaluation): HDFL is
best on model error, fairness and cost; LS-FL (over-select and drop the slowest) is the
fastest but the worst on error and fairness; FedAvg is slow. This
script measures the same comparison on offline data, 3 set-ups x 4 methods x ``--seeds`` seeds.

**Set-ups** (Table I, notes §4.1-4.2), mapped to the data this package ships:

* ``femnist`` 179 clients / 10 a round: LEAF FEMNIST (one writer per client) -> the shipped
  Fashion-MNIST subset (13,200 train, 5,000 test images) over 179 clients with a natural-like
  skew: log-normal client sizes (sigma 0.5, 20 examples at least; FEMNIST writers hold
  unequal amounts) and a mild label skew per client, q_k ~ Dir(1.0 * p) (Hsu et al.;
  writers write every character, unevenly); ~74 train and ~28 test images a client (FEMNIST:
  301 and 30). Batch 10 (Table I).
* ``cifar`` 100 / 10: CIFAR-10 split evenly, at most 5 classes a client -> Fashion-MNIST,
  ``classes_per_client`` c = 5 over 100 clients (~132 train images each). Batch 32 (Table I).
* ``shakespeare`` 30 / 3: LEAF Shakespeare -> LEAF Synthetic(0.5, 0.5) with 30 clients
  (60 features, 10 classes, 1,816 train / 453 test rows), multinomial logistic regression,
  batch 10. Why not the shipped Shakespeare (``catalog.shakespeare_plays``, 30 speakers):
  its 30 clients hold 100,337 train and 23,401 test windows (1 to 19,192 a client); the
  LEAF LSTM (``models.char_lstm``, 2 x 256) takes 0.13 s per gradient step of batch 10 and
  0.8 s per forward pass of 256 windows on this 2-core CPU, so one evaluation costs ~70 s
  and one round of 3 clients (one epoch each) ~45 s: a 100-round run would take over an
  hour, against a budget of ~40 s a run.

Fashion-MNIST set-ups use the package's default model (784-200-200-10 MLP); every set-up
trains with SGD (client lr 0.05), one local epoch, no server momentum (FedAvg), for the
rounds of ``ROUNDS``. Per-client test sets: the Fashion-MNIST test images split to follow
each client's training labels (``partitioners.split_like``); the synthetic data's own. The
data split is fixed (data seed 0); a seed changes the environment, the initial model, the
selection and the local batches.

**Environment** (notes §1.1, §4.4), drawn per seed and identical for all methods:

* latency L_k ~ N(5 s, 1.5 s) clipped at 0.1 s, static per client. **Mapping**: the latency is
  the time of the client's whole local task, so ``step_time_k = L_k / steps_k`` (``steps_k``:
  its local steps of one epoch) and, with infinite bandwidth (no transfer time) and no
  server overhead, a client that finishes takes exactly L_k and a round of FedAvg takes
  max L_k over its clients: the paper's Eq. 8 and Eq. 11 clock (sleep latency only; the
  testbed's real compute is not modelled, notes §6.18).
* dropout: CDR_k ~ Exponential(mean 0.4) clipped to [0, 1] (8 % of clients never finish),
  ``ClientProfiles.dropout``: each time it is selected a client drops with probability
  CDR_k, at a point uniform over its work (``system.schedule``); its steps until then are
  spent (cost) and its update is lost. The server learns of the drop when it happens, so
  a dropped client holds the round only until it drops (the notes' default waits for its
  nominal latency: this is shorter). Common random numbers: the same (seed, round, client)
  drops in every method.

**Methods** (every one in the same environment, ``wait_all`` rounds, no server overhead):

* ``fedavg``: uniform selection of m, the round waits for all, sample-weighted mean.
* ``lsfl`` (Bonawitz et al. 2019 as HDFL runs it): ``sampling.hdfl.ls_fl``, over-commit 1/3
  (``ceil(4/3 m)``: 14 for m = 10, 4 for m = 3), uniform, keep the first m finishers (the
  round ends at the m-th; the others' work is discarded, wasted cost), sample-weighted mean.
  When fewer than m survive the dropouts the round waits for every started client.
* ``hdfl``: ``sampling.hdfl.hdfl`` with its defaults (the notes' suggested ones): profile of
  UEI every I = 10 rounds (and at round 0), beta = 1 on CUEI with c_n over its mean, CDR
  capped at 0.95 in Eq. 6, mutualism exp(-|L_n - L_d| / 1 s) (Eq. 9's sign corrected),
  CDR_max = 0.5 by up to 10 redraws; m slots, anchor included; unweighted mean of the
  returned updates (Alg. 1 line 14: ``weighting="uniform"``).
* ``oort``: ``sampling.oort.oort`` with its defaults (exploration 0.9 decaying to 0.2,
  pacer), m slots, no over-commitment, sample-weighted mean.

HDFL and Oort read each client's latency and CDR from the engine's ``ClientReport``, which
here are exactly L_k and CDR_k (the paper's experiments use the assigned values, notes §5
item 16); UEI profiling is not charged to cost or time (notes §2.5).

**Metrics** (notes §3). Accuracy and fairness of the global model, each the mean over the
last ``TAIL`` = 5 evaluations (the last 50 rounds: one evaluation swings by several points
from round to round under this skew; the values after the last round are kept in
``results.json`` as ``final_*``): global test accuracy (example-weighted); per-client accuracy
on each client's own test set, over all N clients (CDR = 1 ones included, notes §6.16): mean
(1 - HDFL's model error), sample std (n - 1, HDFL's good-intent fairness), 10th percentile
(worst decile). Cost over the run: examples processed by every selected client (dropped and
discarded ones included) and the part wasted by clients whose update was not aggregated
(``metrics.ScheduleAccounting``). Virtual time in hours. Every method runs the same number of
rounds; the report also gives the global accuracy at the virtual time the fastest method of
the same (set-up, seed) needed (the paper's LIM budget, notes §6.28).

Usage::

    python experiments/hdfl_setups.py                 # 3 set-ups x 4 methods x 3 seeds
    python experiments/hdfl_setups.py --resume        # skip finished cells
    python experiments/hdfl_setups.py --report        # table and hdfl_setups.png
    python experiments/hdfl_setups.py --quick --out /tmp/h   # every cell, 1 seed, 2 rounds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # common, also when loaded by its path
import common
import jax
import numpy as np

from fedjax_het.data import catalog
from fedjax_het.data.quantity_skew import lognormal_sizes
from fedjax_het.front import config as config_lib
from fedjax_het.sampling import uniform
from fedjax_het.sampling.hdfl import hdfl, ls_fl
from fedjax_het.sampling.oort import oort
from fedjax_het.system import policy as policies
from fedjax_het.system import setup as system_setup
from fedjax_het.system.schedule import OK
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

OUT = common.RESULTS / "hdfl_setups"
METHODS = ("fedavg", "lsfl", "hdfl", "oort")
LATENCY_MEAN_S, LATENCY_STD_S, LATENCY_MIN_S = 5.0, 1.5, 0.1
CDR_MEAN = 0.4
MIN_SIZE = 20
TAIL = 5  # evaluations averaged for the accuracy and fairness figures


@dataclasses.dataclass(frozen=True)
class SetupSpec:
    """One of the paper's set-ups: population, cohort, and the config overrides of its data."""

    name: str
    paper: str
    num_clients: int
    per_round: int
    overrides: tuple[str, ...]
    size_sigma: float | None = None  # log-normal client sizes (a config cannot give sizes)


SETUPS = {
    "femnist": SetupSpec(
        "femnist",
        "FEMNIST 179/10",
        179,
        10,
        ('partition.kind="dirichlet_client"', "partition.beta=1.0", "local.batch_size=10"),
        size_sigma=0.5,
    ),
    "cifar": SetupSpec(
        "cifar",
        "CIFAR-10 100/10",
        100,
        10,
        ('partition.kind="classes_per_client"', "partition.c=5", "local.batch_size=32"),
    ),
    "shakespeare": SetupSpec(
        "shakespeare",
        "Shakespeare 30/3",
        30,
        3,
        ('data.name="synthetic"', 'model.name="logistic_regression"', "local.batch_size=10"),
    ),
}
ROUNDS = {"femnist": 400, "cifar": 400, "shakespeare": 400}


def experiment(spec: SetupSpec) -> config_lib.Experiment:
    """The data, model, algorithm and local work of ``spec`` (``fedjax_het.front.config``)."""
    sets = [
        f"data.num_clients={spec.num_clients}",
        f"sampler.clients_per_round={spec.per_round}",
        *spec.overrides,
    ]
    exp = config_lib.build(config_lib.load(None, sets))
    if spec.size_sigma is None:
        return exp
    partition = dict(exp.config["partition"])
    pooled = catalog.fashion_mnist_subset()
    partition["sizes"] = lognormal_sizes(
        pooled.y_train.size, spec.num_clients, spec.size_sigma, seed=0, min_size=MIN_SIZE
    )
    data = catalog.federate(pooled, spec.num_clients, partition, seed=exp.config["data"]["seed"])
    return dataclasses.replace(exp, data=data)


def environment(exp: config_lib.Experiment, seed: int) -> dict[str, np.ndarray]:
    """Per-client latency L (seconds a full local task takes), CDR and local steps, for ``seed``."""
    n = exp.data.num_clients
    rng = np.random.default_rng([seed, n])
    latency = np.maximum(rng.normal(LATENCY_MEAN_S, LATENCY_STD_S, n), LATENCY_MIN_S)
    cdr = np.clip(rng.exponential(CDR_MEAN, n), 0.0, 1.0)
    spec = simulate.local_spec(exp.model, exp.algorithm, exp.data, exp.work)
    steps = simulate.steps_needed(spec, exp.data.train.count)
    return {"latency": latency.astype(np.float32), "cdr": cdr.astype(np.float32), "steps": steps}


def system_for(method: str, env: dict[str, np.ndarray], seed: int) -> system_setup.System:
    """Profiles with the environment's latency (as step times) and CDR, and the method's policy."""
    n = env["latency"].shape[0]
    profiles = system_setup.profiles_from_options(n, seed=seed, bandwidth=math.inf).replace(
        step_time=jax.numpy.asarray(env["latency"] / np.maximum(env["steps"], 1)),
        dropout=jax.numpy.asarray(env["cdr"]),
    )
    policy = ls_fl() if method == "lsfl" else system_setup.policy_from_options(kind="wait_all")
    return system_setup.System(profiles, policy)


def select_for(method: str, num_clients: int, num_slots: int):
    """The learned selection of ``method`` (None: the sampler, or uniform among the slots).

    HDFL and Oort read each client's latency and CDR from the engine's ``ClientReport``
    (seconds of its full task at mean speeds, its dropout probability), which here are
    exactly the environment's L_k and CDR_k (no transfer time, ``step_time = L_k / steps``).
    """
    if method in ("fedavg", "lsfl"):
        return None
    if method == "hdfl":
        return hdfl(num_clients, num_slots)
    if method == "oort":
        return oort(num_clients, num_slots)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def train(
    exp: config_lib.Experiment,
    spec: SetupSpec,
    method: str,
    seed: int,
    env: dict[str, np.ndarray],
    *,
    rounds: int,
    eval_every: int,
    progress: bool = False,
) -> simulate.History:
    """Trains ``method`` in the environment ``env`` (``environment``) for ``rounds`` rounds."""
    system = system_for(method, env, seed)
    slots = int(policies.num_selected(spec.per_round, system.policy.over_commit))
    return simulate.run(
        exp.data,
        *run_options(
            model=exp.model,
            algorithm=exp.algorithm,
            sampler=uniform(exp.data.num_clients, spec.per_round),
            rounds=rounds,
            work=exp.work,
            hyper=exp.hyper,
            seed=seed,
            eval_every=eval_every,
            weighting="uniform" if method == "hdfl" else "examples",
            progress=progress,
            system=system,
            select=select_for(method, exp.data.num_clients, slots),
            targets=(),
        ),
    )


def figures(
    history: simulate.History,
    exp: config_lib.Experiment,
    env: dict[str, np.ndarray],
    *,
    tail: int = TAIL,
) -> dict[str, Any]:
    """A run's figures: accuracy and fairness (means over the last ``tail`` evaluations, and
    after the last round), cost, time, and its curve."""
    summary, per_round = history.summary, history.round_metrics
    acc = history.client_accuracy[np.isfinite(history.client_accuracy)]
    s = jax.device_get(history.schedule)
    valid, ok = np.asarray(s.valid), np.asarray(s.outcome) == OK
    selected = np.asarray(s.selected)
    need = np.ceil(exp.work.epochs * exp.data.train.count).astype(np.int64)
    last = [line for line in history.metrics if line["round"] > 0][-tail:]
    n = last[-1]["clients_evaluated"]
    tail_mean = lambda key, scale=1.0: float(np.mean([line[key] for line in last]) * scale)
    return {
        "global_accuracy": tail_mean("test_accuracy"),
        "client_mean": tail_mean("client_accuracy_mean"),
        # The lines hold the population std (n); HDFL's fairness is the sample std (n - 1).
        "client_std": tail_mean("client_accuracy_std", math.sqrt(n / (n - 1))),
        "client_p10": tail_mean("client_accuracy_p10"),
        "final_global_accuracy": summary["final_test_accuracy"],
        "final_client_mean": float(acc.mean()),
        "final_client_std": float(acc.std(ddof=1)),
        "final_client_p10": float(np.percentile(acc, 10)),
        "examples_processed": float(np.sum(per_round["examples_processed"])),
        "examples_wasted": float(np.sum(per_round["examples_wasted"])),
        # Recomputed from the outcomes: the full local epoch of every aggregated slot.
        "examples_aggregated": float(np.sum(np.where(valid & ok, need[selected], 0))),
        "virtual_hours": summary["virtual_s"] / 3600.0,
        "outcomes": summary["outcomes"],
        "participation_gini": summary["participation_gini"],
        "clients_never_participated": summary["clients_never_participated"],
        "mean_cdr_selected": float(env["cdr"][selected[valid]].mean()),
        "curve": [
            {
                k: line.get(k, 0.0)
                for k in (
                    "round",
                    "virtual_s",
                    "test_accuracy",
                    "client_accuracy_mean",
                    "client_accuracy_p10",
                    "examples_processed",
                )
            }
            for line in history.metrics
        ],
        "wall_s": summary["wall_s"],
    }


def run_cell(
    exp: config_lib.Experiment,
    spec: SetupSpec,
    method: str,
    seed: int,
    *,
    rounds: int,
    eval_every: int,
    progress: bool = False,
) -> dict[str, Any]:
    """One (set-up, method, seed) run and its figures."""
    env = environment(exp, seed)
    history = train(
        exp, spec, method, seed, env, rounds=rounds, eval_every=eval_every, progress=progress
    )
    return {
        "setup": spec.name,
        "method": method,
        "seed": seed,
        "rounds": rounds,
        **figures(history, exp, env),
    }


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    path = out / "results.json"
    rows = common.earlier_runs(path, args.resume)
    done = {(r["setup"], r["method"], r["seed"]) for r in rows}
    for name in args.setups:
        spec = SETUPS[name]
        exp = experiment(spec)
        rounds = args.rounds or ROUNDS[name]
        for seed in range(args.seeds):
            for method in args.methods:
                if (name, method, seed) in done:
                    continue
                print(f"== {name} / {method} / seed {seed}", flush=True)
                rows.append(
                    run_cell(
                        exp,
                        spec,
                        method,
                        seed,
                        rounds=rounds,
                        eval_every=args.eval_every,
                        progress=args.progress,
                    )
                )
                r = rows[-1]
                print(
                    f"   acc {r['global_accuracy']:.3f} client mean {r['client_mean']:.3f} "
                    f"std {r['client_std']:.3f} p10 {r['client_p10']:.3f} "
                    f"cost {r['examples_processed'] / 1e3:.0f}k "
                    f"({r['examples_wasted'] / 1e3:.0f}k wasted) "
                    f"{r['virtual_hours']:.2f} h, wall {r['wall_s']:.0f} s",
                    flush=True,
                )
                setups = {k: dataclasses.asdict(v) for k, v in SETUPS.items()}
                common.write_json(path, common.record(args, setups=setups, runs=rows))
    report(out)


MECHANISM = (
    "ok_per_round",
    "dropped_per_round",
    "late_per_round",
    "mean_cdr_selected",
    "participation_gini",
    "clients_never_participated",
)
FIGURES = (
    "global_accuracy",
    "client_mean",
    "client_std",
    "client_p10",
    "examples_processed",
    "examples_wasted",
    "virtual_hours",
)


def at_budget(runs: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, float]]:
    """Each run's last evaluation within the virtual time of the fastest method of its
    (set-up, seed): global and client-mean accuracy there (the paper's LIM budget)."""
    budget: dict[tuple[str, int], float] = {}
    for r in runs:
        key = (r["setup"], r["seed"])
        budget[key] = min(budget.get(key, math.inf), r["curve"][-1]["virtual_s"])
    out = {}
    for r in runs:
        limit = budget[(r["setup"], r["seed"])] * (1 + 1e-9)
        line = [c for c in r["curve"] if c["virtual_s"] <= limit][-1]
        out[(r["setup"], r["method"], r["seed"])] = {
            "budget_accuracy": line["test_accuracy"],
            "budget_client_mean": line["client_accuracy_mean"],
            "budget_round": line["round"],
        }
    return out


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread (min, max over seeds) of each figure per (set-up, method)."""
    limited = at_budget(runs)
    cells = common.group_by(
        ({**r, **limited[(r["setup"], r["method"], r["seed"])]} for r in runs),
        lambda r: (r["setup"], r["method"]),
    )
    order = {name: i for i, name in enumerate([*SETUPS, *METHODS])}
    table = []
    for (name, method), cell in sorted(
        cells.items(), key=lambda kv: (order.get(kv[0][0], 99), order.get(kv[0][1], 99))
    ):
        entry: dict[str, Any] = {"setup": name, "method": method, "seeds": len(cell)}
        for r in cell:
            r.update(
                {
                    f"{name}_per_round": r["outcomes"][name] / r["rounds"]
                    for name in ("ok", "dropped", "late")
                }
            )
        for key in (*FIGURES, *MECHANISM, "budget_accuracy", "budget_client_mean", "budget_round"):
            entry[key] = common.mean_min_max(r[key] for r in cell)
        table.append(entry)
    return table


def report(out: Path) -> None:
    """Prints the table (mean [min-max] over seeds) and draws ``hdfl_setups.png``."""
    record = json.loads((out / "results.json").read_text())
    table = summarise(record["runs"])
    f3 = common.spread
    k = lambda v: f"{v[0] / 1e3:.0f}k [{v[1] / 1e3:.0f}-{v[2] / 1e3:.0f}]"
    h = lambda v: common.spread(v, "{:.2f}")
    print(
        "| set-up | method | global acc | client-mean acc | client std (fairness, lower "
        "is fairer) | client p10 (worst decile) | examples processed (cost) | of which wasted "
        "| virtual h | global acc at the fastest's time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for e in table:
        paper = SETUPS[e["setup"]].paper if e["setup"] in SETUPS else e["setup"]
        print(
            f"| {paper} | {e['method']} | {f3(e['global_accuracy'])} | {f3(e['client_mean'])} "
            f"| {f3(e['client_std'])} | {f3(e['client_p10'])} | {k(e['examples_processed'])} "
            f"| {k(e['examples_wasted'])} | {h(e['virtual_hours'])} "
            f"| {f3(e['budget_accuracy'])} |"
        )
    print(f"\nmean [min-max] over seeds; accuracies and std: mean of the last {TAIL} evaluations\n")
    print(
        "| set-up | method | updates aggregated / round | dropped / round | discarded (late) "
        "/ round | mean CDR of the selected | participation Gini | clients never aggregated |"
    )
    print("|---|---|---|---|---|---|---|---|")
    f2 = h
    for e in table:
        paper = SETUPS[e["setup"]].paper if e["setup"] in SETUPS else e["setup"]
        print(
            f"| {paper} | {e['method']} | {f2(e['ok_per_round'])} "
            f"| {f2(e['dropped_per_round'])} | {f2(e['late_per_round'])} "
            f"| {f2(e['mean_cdr_selected'])} | {f2(e['participation_gini'])} "
            f"| {e['clients_never_participated'][0]:.1f} |"
        )
    print()
    for line in verdict(table):
        print(line)
    plot(record["runs"], table, out / "hdfl_setups.png")


def verdict(table: list[dict[str, Any]]) -> list[str]:
    """Per set-up, the best method on each figure (by mean over seeds)."""
    lines = []
    better = {
        "client_mean": max,
        "client_std": min,
        "client_p10": max,
        "examples_processed": min,
        "virtual_hours": min,
    }
    for name in dict.fromkeys(e["setup"] for e in table):
        rows = [e for e in table if e["setup"] == name]
        best = {
            key: pick(rows, key=lambda e, key=key: e[key][0])["method"]
            for key, pick in better.items()
        }
        lines.append(
            f"- {name}: best client-mean accuracy {best['client_mean']}, fairness (std) "
            f"{best['client_std']}, worst decile {best['client_p10']}, cost "
            f"{best['examples_processed']}, time {best['virtual_hours']}"
        )
    return lines


def plot(runs: list[dict[str, Any]], table: list[dict[str, Any]], path: Path) -> None:
    """Per set-up: global accuracy against virtual hours (seed 0), and the error/fairness/cost
    bars (mean with min-max over seeds)."""
    names = list(dict.fromkeys(e["setup"] for e in table))
    size = (5.2 * len(names), 7.5)
    figure = common.figure(path, dpi=110, nrows=2, ncols=len(names), figsize=size, squeeze=False)
    with figure as (_, axes):
        for col, name in enumerate(names):
            first_seed = [r for r in runs if r["setup"] == name and r["seed"] == 0]
            plot_curves(axes[0, col], first_seed, SETUPS[name].paper if name in SETUPS else name)
            plot_bars(axes[1, col], [e for e in table if e["setup"] == name])


def plot_curves(ax, runs: list[dict[str, Any]], title: str) -> None:
    """Client-mean accuracy against virtual hours, a line per method."""
    colours = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for r in runs:
        ax.plot(
            [c["virtual_s"] / 3600 for c in r["curve"]],
            [c["client_accuracy_mean"] for c in r["curve"]],
            label=r["method"],
            color=colours.get(r["method"]),
        )
    ax.set(xlabel="virtual hours", ylabel="client-mean test accuracy", title=f"{title} (seed 0)")
    ax.grid(alpha=0.3)
    ax.legend()


def plot_bars(ax, rows: list[dict[str, Any]]) -> None:
    """Error and fairness bars per method, the cost as markers on a second axis."""
    series = (
        ("client_mean", "client mean acc"),
        ("client_std", "client std"),
        ("client_p10", "client p10"),
    )
    x = common.spread_bars(ax, rows, series)
    cost = ax.twinx()
    processed = [e["examples_processed"][0] / 1e3 for e in rows]
    cost.plot(x, processed, "k^", label="examples processed (cost)")
    cost.set_ylabel("examples processed (thousands)")
    cost.set_ylim(0, 1.4 * max(processed))
    ax.set_xticks(x, [e["method"] for e in rows])
    ax.set_ylim(0, 1.25)
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    cost.legend(loc="upper right", fontsize=7, bbox_to_anchor=(1.0, 0.92))


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setups", type=lambda s: s.split(","), default=list(SETUPS))
    parser.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=0, help="0: each set-up's ROUNDS")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="every set-up and method at tiny size: 1 seed, 2 rounds"
    )
    common.add_output_flags(parser, OUT, resume=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds, args.eval_every = 1, 2, 1
    return args


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
