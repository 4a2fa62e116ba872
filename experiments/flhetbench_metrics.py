"""FLHetBench's metric validation (§5.2, Figs. 4-7): do the Monte-Carlo metrics track FedAvg?

Zhang et al. (CVPR 2024) train FedAvg on 21 DPGMM device sets (everyone always available), 21
DPCSM state sets (homogeneous devices) and the 16 device x state pairs, and report the Pearson
r of each metric with the run's outcome: final accuracy under a deadline (the R metrics), time
to a target under readiness (the T metrics); DevMC-R/T, StatMC-R/T (r = 0.916 / 0.906) and
InterMC-R/T (r > 0.84) beat the STD, KS and JS of the same data (notes §3.5, §6.3).

Here, on the default experiment (Fashion-MNIST subset, ``--beta`` Dirichlet over 100 clients,
the MLP, 10 a round, one epoch of batch 20), ``--rounds`` rounds per set, each study's sets as
one ``sweep`` program per policy (deadline ``--deadline`` s, readiness 0.2; 5 s overhead,
start at trace time 86,400 s, work paused while not ready):

* ``device``: 21 sets, DPGMM at spreads 0, 0.05, ..., 1.0 (std / mean of client speeds; the
  released cases are 0, 0.11, 0.25, 0.65), AI-Benchmark devices, FLASH links, always
  available. Metrics DevMC-R / DevMC-T.
* ``state``: 21 sets, DPCSM at alpha in (1, 2, 4, 8, 16, 32, 64) x start fraction in
  (0.05, 0.2, 0.35) (the released cases: alpha 1-10 at 0.35 and 0.07) over FLASH strict traces,
  every device ``--step-time`` s a step on 10 MB/s links. Metrics StatMC-R / StatMC-T.
* ``inter``: the 16 released device x state cases. Metrics InterMC-R / InterMC-T.

Baselines (the paper does not say how it computed them; decided here, notes §3.5): over the
clients' values (step time for devices, ready fraction of the trace for states; the inter
study uses a client's step time divided by its ready fraction), ``STD`` is their std over
their mean, ``KS`` the two-sample Kolmogorov-Smirnov statistic against the database's values
(every AI-Benchmark device, every trace) and ``JS`` the Jensen-Shannon distance between the
two histograms on 20 log-spaced bins. Every value is correlated as it is. An R metric is 1 for
an easy set and falls with heterogeneity, a T metric is 1 for an easy set and rises with it
(``fedjax_het.system.flhetbench``), so the paper's claim reads as a large positive r in both
cases: R against final accuracy, T against the hours to the target (DevMC-T r > 0.95, notes
§6.3). The baselines have no direction of their own (a distance from the database is not a
difficulty), so for them the size of r is what compares.

Usage::

    python experiments/flhetbench_metrics.py --quick --out /tmp/m      # 3 sets a study, 2 rounds
    python experiments/flhetbench_metrics.py --studies inter --rounds 200 --beta 0.1
    python experiments/flhetbench_metrics.py --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # common, also when loaded by its path
import common
import jax
import numpy as np
from scipy import stats

from fedjax_het import registry
from fedjax_het.front import config as config_lib
from fedjax_het.front.sweep import sweep
from fedjax_het.sampling import presets
from fedjax_het.system import flhetbench, setup, sources
from fedjax_het.training import simulate
from fedjax_het.training.online import upload_bytes

OUT = common.RESULTS / "flhetbench_metrics"
SPREADS = tuple(round(0.05 * i, 2) for i in range(21))
STATES = tuple((a, s) for a in (1, 2, 4, 8, 16, 32, 64) for s in (0.05, 0.2, 0.35))
CASES = ("case1", "case2", "case3", "case4")
METRIC = {"device": "dev_mc", "state": "stat_mc", "inter": "inter_mc"}
BASELINES = ("std", "ks", "js")


def device_sampler(speeds, *, num_clients: int, level: str, seed: int) -> np.ndarray:
    """DPGMM rows at the spread ``level`` (a number), the released cases' K and alpha."""
    preset = presets.DevicePreset("validation", spread=float(level))
    return presets.sample_devices(preset, speeds, num_clients=num_clients, seed=seed).indices


def state_sampler(scores, *, num_clients: int, level: str, seed: int) -> np.ndarray:
    """DPCSM rows at ``level`` = "alpha/start_fraction"."""
    alpha, start = (float(x) for x in level.split("/"))
    preset = presets.StatePreset("validation", alpha=alpha, start_fraction=start)
    return presets.sample_states(preset, scores, num_clients=num_clients, seed=seed).indices


registry.register("device_sampler", "validation", device_sampler)
registry.register("state_sampler", "validation", state_sampler)


def sets(study: str, n: int, args: argparse.Namespace) -> list[tuple[str, Any]]:
    """``(label, profiles)`` of every set of ``study``."""
    flash = {"devices": "flash", "device_sampler": "validation", "network": "flash"}
    if study == "device":
        levels = SPREADS[:: len(SPREADS) // 2] if args.quick else SPREADS
        return [
            (f"spread {s}", setup.profiles_from_options(
                n, **flash, device_level=str(s), step_time=args.step_time))
            for s in levels
        ]  # fmt: skip
    if study == "state":
        levels = STATES[:: len(STATES) // 2] if args.quick else STATES
        return [
            (f"alpha {a} start {s}", setup.profiles_from_options(
                n, step_time=args.step_time, bandwidth=1e7, availability="strict",
                state_sampler="validation", state_level=f"{a}/{s}"))
            for a, s in levels
        ]  # fmt: skip
    pairs = [(d, s) for d in CASES for s in CASES][:: 6 if args.quick else 1]
    return [
        (f"D{d[-1]} S{s[-1]}", setup.profiles_from_options(
            n, devices="flash", device_sampler="dpgmm", device_level=d, step_time=args.step_time,
            network="flash", availability="strict", state_sampler="dpcsm", state_level=s))
        for d, s in pairs
    ]  # fmt: skip


def client_values(study: str, profiles, step_time: float) -> tuple[np.ndarray, np.ndarray]:
    """The clients' values the baselines read, and the database's in the same units (every
    AI-Benchmark device's step time when the median one takes ``step_time``; module
    docstring)."""
    step = np.asarray(profiles.step_time, np.float64)
    scores = np.asarray(sources.load_devices()["ai_score"], np.float64)
    database_step = step_time * np.median(scores) / scores
    if study == "device":
        return step, database_step
    ready = np.asarray(profiles.availability.ready_per_period, np.float64) / np.asarray(
        profiles.availability.period, np.float64
    )
    mine = ready[np.asarray(profiles.trace)]
    if study == "state":
        return mine, ready
    return step / mine, np.outer(database_step, 1.0 / ready).ravel()


def baselines(values: np.ndarray, database: np.ndarray) -> dict[str, float]:
    """STD (over the mean), KS and JS of ``values`` against ``database`` (same units)."""
    v, d = values / np.median(database), database / np.median(database)
    bins = np.geomspace(min(v.min(), d.min()), max(v.max(), d.max()) * (1 + 1e-9), 21)
    p, q = np.histogram(v, bins)[0], np.histogram(d, bins)[0]
    js = float(np.sqrt(max(_js(p / p.sum(), q / q.sum()), 0.0)))
    return {"std": float(v.std() / v.mean()), "ks": float(stats.ks_2samp(v, d).statistic),
            "js": js}  # fmt: skip


def _kl(a: np.ndarray, m: np.ndarray) -> float:
    """``KL(a || m)`` in bits (``m > 0`` wherever ``a > 0``)."""
    ratio = np.where(a > 0, a, 1) / np.where(a > 0, m, 1)
    return float(np.sum(np.where(a > 0, a * np.log2(ratio), 0)))


def _js(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (bits) of two distributions."""
    m = (p + q) / 2
    return (_kl(p, m) + _kl(q, m)) / 2


def mc_metrics(study: str, profiles, exp, steps, args) -> dict[str, float]:
    """The study's R and T metric at this workload."""
    payload = float(upload_bytes(jax.eval_shape(exp.model.init, jax.random.key(0))))
    mc = flhetbench.MonteCarlo(
        cohort_size=exp.sampler.cohort_size, rounds=args.mc_rounds, trips=args.mc_trips,
        deadline=args.deadline, overhead=5.0, payload=payload, start=86_400.0,
    )  # fmt: skip
    key, name = jax.random.key(0), METRIC[study]
    if study == "state":  # the paper's StatMC averages fixed costs; R and T alike
        r = flhetbench.stat_mc_r(profiles, key=key, mc=mc)
        t = flhetbench.stat_mc_t(profiles, key=key, mc=mc)
    else:
        r = getattr(flhetbench, f"{name}_r")(profiles, key=key, mc=mc, steps_needed=steps)
        t = getattr(flhetbench, f"{name}_t")(profiles, key=key, mc=mc, steps_needed=steps)
    return {"mc_r": float(r), "mc_t": float(t)}


def run_study(study: str, exp, args) -> list[dict[str, Any]]:
    """FedAvg under both policies on every set of ``study``, with each set's metrics."""
    labelled = sets(study, exp.data.num_clients, args)
    spec = simulate.local_spec(exp.model, exp.algorithm, exp.data, exp.work)
    steps = simulate.steps_needed(spec, exp.data.train.count)
    kwargs = {k: v for k, v in exp.run_kwargs().items() if k not in ("system", "seed", "select")}
    rows = [
        {"study": study, "set": label, **mc_metrics(study, p, exp, steps, args),
         **baselines(*client_values(study, p, args.step_time))}
        for label, p in labelled
    ]  # fmt: skip
    common_policy = {"overhead": 5.0, "start": 86_400.0, "on_unavailable": "pause"}
    policies = {
        "deadline": setup.policy_from_options(
            kind="deadline", deadline=args.deadline, **common_policy),
        "readiness": setup.policy_from_options(kind="readiness", readiness=0.2, **common_policy),
    }  # fmt: skip
    for name, policy in policies.items():
        histories = sweep(
            exp.data, exp.model, exp.algorithm, exp.sampler,
            systems=[setup.System(p, policy) for _, p in labelled], seeds=(args.seed,),
            progress=False, targets=(args.target,), **kwargs,
        )  # fmt: skip
        for row, h in zip(rows, histories):
            hit = h.summary["to_accuracy"].get(f"{args.target:g}")
            row[f"{name}_accuracy"] = h.summary["final_test_accuracy"]
            row[f"{name}_hours_to_target"] = None if hit is None else hit["virtual_s"] / 3600
            row[f"{name}_never_aggregated"] = h.summary["clients_never_participated"]
    return rows


def main(args: argparse.Namespace) -> None:
    path = common.out_dir(args.out) / "results.json"
    overrides = [f"rounds={args.rounds}", f"partition.beta={args.beta}", "partition.min_size=1",
                 "partition.max_tries=1000"]  # fmt: skip
    exp = config_lib.build(config_lib.load(None, overrides))
    record = common.record(args, rows=[])
    for study in args.studies:
        record["rows"] += run_study(study, exp, args)
        common.write_json(path, record)
        print(f"{study}: {sum(r['study'] == study for r in record['rows'])} sets", flush=True)
    report(path.parent)


PAIRS = (  # (metric or baseline, outcome): R metrics with accuracy, T metrics with time
    ("mc_r", "deadline_accuracy"), *((b, "deadline_accuracy") for b in BASELINES),
    ("mc_t", "readiness_hours_to_target"), *((b, "readiness_hours_to_target") for b in BASELINES),
)  # fmt: skip


def correlations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pearson r of each metric with its outcome, per study (sets with both known)."""
    out = []
    for study in METRIC:
        mine = [r for r in rows if r["study"] == study]
        for x, y in PAIRS:
            pairs = np.array([(r[x], r[y]) for r in mine if r[y] is not None], float)
            ok = len(pairs) >= 3 and np.ptp(pairs[:, 0]) > 0 and np.ptp(pairs[:, 1]) > 0
            r = float(np.corrcoef(pairs.T)[0, 1]) if ok else float("nan")
            if mine:
                out.append({"study": study, "x": x, "y": y, "r": r, "n": len(pairs)})
    return out


def report(out: Path) -> None:
    """Prints the r table and draws ``metrics.png`` (each metric against its outcome)."""
    record = json.loads((out / "results.json").read_text())
    table = correlations(record["rows"])
    print("| study | metric | outcome | Pearson r | sets |\n|---|---|---|---|---|")
    for c in table:
        name = f"{METRIC[c['study']]}_{c['x'][-1]}" if c["x"].startswith("mc_") else c["x"]
        print(f"| {c['study']} | {name} | {c['y']} | {c['r']:+.2f} | {c['n']} |")
    studies = [s for s in METRIC if any(r["study"] == s for r in record["rows"])]
    size = (4 * len(PAIRS) // 2, 3.2 * len(studies))
    with common.figure(out / "metrics.png", nrows=len(studies), ncols=len(PAIRS) // 2 * 2,
                       figsize=size, squeeze=False) as (_, axes):  # fmt: skip
        for i, study in enumerate(studies):
            rows = [r for r in record["rows"] if r["study"] == study]
            for j, (x, y) in enumerate(PAIRS):
                ax = axes[i, j]
                pts = [(r[x], r[y]) for r in rows if r[y] is not None]
                if pts:
                    ax.scatter(*zip(*pts), s=12)
                r = next(c["r"] for c in table if (c["study"], c["x"], c["y"]) == (study, x, y))
                ax.set_title(f"{study}: {x} vs {y.split('_')[0]} (r {r:+.2f})", fontsize=8)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--studies", nargs="+", default=list(METRIC), choices=list(METRIC))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--beta", type=float, default=0.5, help="Dirichlet label skew")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-time", type=float, default=0.5, help="median device, s/step")
    parser.add_argument("--deadline", type=float, default=10.0)
    parser.add_argument("--target", type=float, default=0.7)
    parser.add_argument("--mc-rounds", type=int, default=1000)
    parser.add_argument("--mc-trips", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 sets a study, 2 rounds")
    common.add_output_flags(parser, OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.mc_rounds, args.mc_trips, args.target = 2, 50, 200, 0.1
    return args


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
