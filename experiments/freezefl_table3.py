"""FreezeFL's Table III and Table IV under this project's conditions, scaled to a 2-core CPU.

Chou, Chang and Chou, "FreezeFL: Accelerating Federated Learning in Heterogeneous Edge Devices
by Layer Freezing" (notes: ../shared/papers/dace-gandalf-freezefl-notes.md, B.2). Table III
compares FedAvg, layer freezing ("Freezing"), freezing with the paper's client selection
("w/ CS", Eqs. 5-7) and with its warm restarts ("w/ CS,WR", Eq. 8), RBCS-F and FjORD under
two stop rules: a fixed number of rounds (best test accuracy, mean round length) and a target
accuracy (rounds and total time to reach it). Table IV adds FjORD with the paper's selection.
Added: HeteroFL and FedRolex rows, and Fig. 4 (participation by capability group).

**Methods** (each a config; ``METHODS``): ``fedavg``; ``freezing``
(``algorithm.name = "freezefl"``, beta from Table I: 4 FEMNIST, 2.125 Shakespeare);
``freezing_cs`` (+ ``[selection] name = "freezefl"``, ``warm_restarts = false``);
``freezing_cs_wr`` (``warm_restarts = true``, ``restart_every`` = Phi); ``rbcs_f``
(FedAvg with ``[selection] name = "rbcs_f"``, client status known as the paper ran it);
``fjord``; ``fjord_cs`` (Table IV: FjORD with ``[selection] name = "freezefl"``, no warm
restarts, as Table III names "w/ CS"); ``heterofl``; ``fedrolex``. The width methods take
their packages' default widths, each client's level from its step time by quantile
(``submodels.levels_by_speed``: faster devices wider), passed as ``algorithm.client_levels``.

**Capabilities** (``--capabilities``), identical for every method of a (set-up, seed):

* ``uniform6x``, the paper's: speed ``s_k ~ U[1/6, 1]`` (capability uniform, a gap up to
  six times), step time ``t_fast / s_k`` and, computation and communication proportional,
  bandwidth ``s_k * B`` with ``B`` such that moving the full model one way takes as long
  as ``COMM_STEPS`` local steps. Written as two CSVs (``[system] devices`` and ``network``
  paths, under ``<out>/profiles/``): ``[system]`` has no built-in uniform spread of speeds.
* ``flash``: ``system.devices = "flash"`` (AI-Benchmark devices, the median device taking
  ``t_fast`` a step) and ``system.network = "flash"``, drawn with the run's seed.

Every run: always available, no dropout, ``wait_all`` rounds, no server overhead: the
paper's "soft deadline" T_r is no cut-off but what a FreezeFL client compares its time to
when freezing; a round lasts as long as its slowest client (§III). T_r starts at the first
round's mean (``algorithms.freezefl``; the paper's T_0 = 1 / 4 is in its own time unit).

**Scale** (``SCALES``; ``--quick`` for CI, default for this machine, ``--full`` the paper's
sizes, documented, not run here). Table I's populations (3,550 FEMNIST writers, 660
Shakespeare roles) and R_max = 80 / 40 do not fit 2 shared cores for 9 methods x 3 seeds x 2
capabilities x 2 data sets. Scaled down: ``femnist`` is the FEMNIST CNN (2 conv, 2 dense)
on the shipped Fashion-MNIST subset (Dirichlet 0.5 over N clients, a ``train_share`` of each
client's rows kept, at least ``min_rows``, at most ``max_rows``), batch 12; ``shakespeare``
is the 2-layer char LSTM (``hidden`` units, embedding 8) on the plays (N speakers with at
least 3,000 characters, each client's first windows kept), batch 10. Below ``--full`` it
learns the sequence task (``data.targets = "every"``, ``model.every_position = true``: the
same characters as targets as LEAF's windows, each read once per epoch in 1/80 of the forward
passes) at client lr 1.6; ``--full`` is LEAF's (a window per offset, lr 0.8). Client lr 0.05
elsewhere. E = 3. Phi scales with the rounds as in the paper (0.75 R_max: 60 of 80, 30
of 40), so a warm restart happens once, as there. Targets (``SetupSpec.target``) are what the
scaled runs reach. A run that diverges (``simulate.Diverged``) is kept as a row the tables
leave out and the report names; non-finite client updates are dropped (``engine.nonfinite``).

**Fig. 4**: clients ranked by expected full-model exchange time, cut into ``BINS`` equal
groups (1: the slowest; the paper: 40), each method's selections per group over the seeds.
Usage: ``python experiments/freezefl_table3.py [--quick | --full] [--resume] [--report]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import operator
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # common, also when loaded by its path
import common
import jax
import numpy as np
from freezefl_rounds import EPOCHS

from fedjax_het.algorithms.fedrolex import DEFAULT_WIDTHS as FEDROLEX_WIDTHS
from fedjax_het.algorithms.fjord import DEFAULT_WIDTHS as FJORD_WIDTHS
from fedjax_het.algorithms.heterofl import DEFAULT_WIDTHS as HETEROFL_WIDTHS
from fedjax_het.algorithms.submodels import levels_by_speed
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.front import config as config_lib
from fedjax_het.training import simulate
from fedjax_het.training.divergence import Diverged

OUT = common.RESULTS / "freezefl_table3"
COMM_STEPS = 1.0  # uniform6x: one-way transfer of the full model = this many local steps
BINS = 10
WIDTHS = {  # each algorithm's default width ratios, written into the run's config
    "fjord": FJORD_WIDTHS,
    "fjord_cs": FJORD_WIDTHS,
    "heterofl": HETEROFL_WIDTHS, "fedrolex": FEDROLEX_WIDTHS,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SetupSpec:
    """A data set of Table III at one scale: population, cohort, data kept, model, rounds."""

    name: str
    num_clients: int
    per_round: int
    rounds: int
    overrides: tuple[str, ...]
    beta: float  # Table I
    target: float  # the target-accuracy stop rule at this scale
    train_share: float = 1.0  # of each client's training rows kept, clipped to [min, max]
    min_rows: int = 1
    max_rows: int = 10**9
    test_rows: int = 10**9  # test rows kept per client
    step_time: float = 0.5  # seconds a step takes on the fastest (uniform6x) / median (flash)


def _femnist(n: int, k: int, rounds: int, share: float, lo: int, hi: int, test: int,
             target: float) -> SetupSpec:  # fmt: skip
    return SetupSpec(
        "femnist", n, k, rounds,
        ('model.name="femnist_cnn"', "local.batch_size=12"), 4.0, target, share, lo, hi, test,
    )  # fmt: skip


def _shakespeare(n: int, k: int, rounds: int, hidden: int, lo: int, hi: int, test: int,
                 target: float, targets: str = "every", lr: float = 1.6) -> SetupSpec:  # fmt: skip
    return SetupSpec(
        "shakespeare", n, k, rounds,
        ('data.name="shakespeare"', "data.min_chars=3000", f'data.targets="{targets}"',
         'model.name="char_lstm"', f"model.hidden={hidden}",
         f"model.every_position={str(targets == 'every').lower()}", "local.batch_size=10",
         f"algorithm.client_lr={lr}"),
        2.125, target, 1.0, lo, hi, test,
    )  # fmt: skip


SCALES = {
    "quick": {"femnist": _femnist(8, 2, 2, 0.03, 8, 16, 4, 0.3),
              "shakespeare": _shakespeare(6, 2, 2, 16, 2, 2, 1, 0.1)},
    "default": {
        "femnist": _femnist(30, 4, 16, 0.06, 12, 24, 12, 0.6),
        # Sequence targets: LEAF's windows at 128 units stayed at 33.6 % after 30 rounds;
        # these reach 45 % (README, FreezeFL section).
        "shakespeare": _shakespeare(40, 4, 50, 128, 1, 10**9, 10**9, 0.42),
    },
    # The paper's Table I (3,550 / 660 clients, R_max 80 / 40) as far as the shipped data go:
    # every Fashion-MNIST subset row over 3,550 clients is 4 images each, so 330 clients (its
    # 13,200 rows at FEMNIST's 40 a client); every speaker with 3,000 characters, all rows, the
    # 2 x 256 LSTM. The paper's per-round cohort is not given; 10 as in LEAF.
    "full": {
        "femnist": _femnist(330, 10, 80, 1.0, 1, 10**9, 10**9, 0.75),
        "shakespeare": _shakespeare(660, 10, 40, 256, 1, 10**9, 10**9, 0.51, "last", 0.8),
    },
}  # fmt: skip
CAPABILITIES = ("uniform6x", "flash")
METHODS = {
    "fedavg": "FedAvg", "freezing": "Freezing", "freezing_cs": "Freezing w/ CS",
    "freezing_cs_wr": "Freezing w/ CS,WR", "rbcs_f": "RBCS-F", "fjord": "FjORD",
    "fjord_cs": "FjORD w/ CS", "heterofl": "HeteroFL", "fedrolex": "FedRolex",
}  # fmt: skip
COMPARE = {"<": operator.lt, ">": operator.gt, ">=": operator.ge}
# Tables III and IV: best accuracy (%), round length, rounds to target, total time to target.
PAPER = {
    "femnist": {
        "fedavg": (77.92, 1.52, 46.13, 70.56), "freezing": (79.87, 1.07, 42.18, 44.81),
        "freezing_cs": (79.49, 1.01, 42.44, 42.96), "freezing_cs_wr": (80.02, 1.03, 43.52, 44.78),
        "rbcs_f": (77.67, 0.892, 52.75, 47.01), "fjord": (75.79, 0.95, 68.74, 64.83),
        "fjord_cs": (76.17, 0.93, None, None),
    },
    "shakespeare": {
        "fedavg": (54.16, 4.95, 22.63, 109.22), "freezing": (54.18, 3.47, 20.08, 68.80),
        "freezing_cs": (53.91, 2.66, 19.53, 51.09), "freezing_cs_wr": (54.15, 2.94, 19.71, 54.48),
        "rbcs_f": (51.99, 1.94, 35.68, 69.34), "fjord": (51.56, 3.70, 34.41, 127.75),
        "fjord_cs": (52.02, 3.34, None, None),
    },
}  # fmt: skip
PAPER_TARGET = {"femnist": 0.75, "shakespeare": 0.51}


def method_sets(method: str, spec: SetupSpec, levels: Sequence[int] = ()) -> list[str]:
    """The config overrides of ``method`` (``METHODS``) in ``spec``, its width ``levels``."""
    phi = max(1, round(0.75 * spec.rounds))
    cs = ['selection.name="freezefl"', f"selection.restart_every={phi}"]
    freezing = ['algorithm.name="freezefl"', f"algorithm.beta={spec.beta}",
                f"algorithm.epochs={EPOCHS}"]  # fmt: skip
    width = [f"algorithm.widths={list(WIDTHS.get(method, ()))}",
             f"algorithm.client_levels={list(levels)}"]  # fmt: skip
    table = {
        "fedavg": ['algorithm.name="fedavg"'], "freezing": freezing,
        "freezing_cs": [*freezing, *cs, "selection.warm_restarts=false"],
        "freezing_cs_wr": [*freezing, *cs, "selection.warm_restarts=true"],
        "rbcs_f": ['algorithm.name="fedavg"', 'selection.name="rbcs_f"'],
        "fjord": ['algorithm.name="fjord"', *width],
        "fjord_cs": ['algorithm.name="fjord"', *width, *cs, "selection.warm_restarts=false"],
        "heterofl": ['algorithm.name="heterofl"', *width],
        "fedrolex": ['algorithm.name="fedrolex"', *width],
    }  # fmt: skip
    if method not in table:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return table[method]


def uniform6x_csvs(spec: SetupSpec, seed: int, model_bytes: int, folder: Path) -> list[str]:
    """The ``[system]`` overrides reading ``seed``'s uniform six-fold capabilities (CSVs)."""
    speed = np.random.default_rng([seed, spec.num_clients, 6]).uniform(1 / 6, 1, spec.num_clients)
    bandwidth = speed * model_bytes / (COMM_STEPS * spec.step_time)
    folder.mkdir(parents=True, exist_ok=True)
    devices = folder / f"{spec.name}_n{spec.num_clients}_seed{seed}_devices.csv"
    network = folder / f"{spec.name}_n{spec.num_clients}_seed{seed}_network.csv"
    devices.write_text("client,step_time_s\n" + "".join(
        f"{k},{float(spec.step_time / s)!r}\n" for k, s in enumerate(speed)))  # fmt: skip
    network.write_text("client,down_bytes_per_s,up_bytes_per_s\n" + "".join(
        f"{k},{float(b)!r},{float(b)!r}\n" for k, b in enumerate(bandwidth)))  # fmt: skip
    return [f'system.devices="{devices.resolve()}"', f'system.network="{network.resolve()}"']


def base_sets(spec: SetupSpec, capability: str, seed: int, folder: Path) -> list[str]:
    """The overrides every method of a (set-up, capability, seed) shares."""
    sets = [
        f"data.num_clients={spec.num_clients}", f"sampler.clients_per_round={spec.per_round}",
        f"local.epochs={EPOCHS}", f"rounds={spec.rounds}", "eval_every=1", f"seed={seed}",
        *spec.overrides, 'policy.kind="wait_all"', f"system.seed={seed}",
        f"system.step_time={spec.step_time}", 'engine.nonfinite="drop"',
        # One device: the char LSTM's scan, vmapped inside the cohort's shard_map over several
        # devices, fails to trace in JAX 0.10 (a context-mesh error in broadcast_in_dim).
        "engine.devices=1",
    ]  # fmt: skip
    if capability == "flash":
        return [*sets, 'system.devices="flash"', 'system.network="flash"']
    if capability != "uniform6x":
        raise ValueError(f"capability must be one of {CAPABILITIES}, got {capability!r}")
    probe = config_lib.build(config_lib.load(None, [*sets, "rounds=1"]))
    return [*sets, *uniform6x_csvs(spec, seed, model_bytes(probe.model), folder)]


def model_bytes(model: Any) -> int:
    """Bytes of the full model's params (what a client downloads and, unfrozen, uploads)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.init(jax.random.key(0))))


def subsample(data: FederatedData, spec: SetupSpec) -> FederatedData:
    """Each client's first ``train_share`` of rows (within the min, max) and ``test_rows``."""

    def keep(split: ClientArrays, count: np.ndarray) -> ClientArrays:
        return ClientArrays.from_clients(
            [split.client(k)[0][: count[k]] for k in range(split.num_clients)],
            [split.client(k)[1][: count[k]] for k in range(split.num_clients)],
        )

    rows = np.clip(np.ceil(spec.train_share * data.train.count), spec.min_rows, spec.max_rows)
    train = keep(data.train, np.minimum(rows, data.train.count).astype(int))
    test = None if data.test is None else keep(
        data.test, np.minimum(spec.test_rows, data.test.count))  # fmt: skip
    return FederatedData(train, test, data.num_classes, data.name)


def experiment(spec: SetupSpec, capability: str, method: str, seed: int,
               folder: Path) -> config_lib.Experiment:  # fmt: skip
    """The built experiment of one run, its data subsampled (``subsample``)."""
    sets = base_sets(spec, capability, seed, folder)
    levels: tuple[int, ...] = ()
    if method in WIDTHS:  # levels from the built profiles' step times
        probe = config_lib.build(config_lib.load(None, [*sets, *method_sets("fedavg", spec)]))
        levels = levels_by_speed(np.asarray(probe.system.profiles.step_time), len(WIDTHS[method]))
    exp = config_lib.build(config_lib.load(None, [*sets, *method_sets(method, spec, levels)]))
    return dataclasses.replace(exp, data=subsample(exp.data, spec))


def exchange_seconds(exp: config_lib.Experiment) -> np.ndarray:
    """Each client's expected full-model exchange time: E epochs of steps at its step time,
    the model down and up at its mean bandwidths (the ranking of Fig. 4's groups)."""
    p = exp.system.profiles
    steps = np.ceil(exp.data.train.count / exp.work.batch_size) * exp.work.epochs
    size = model_bytes(exp.model)
    down, up = np.asarray(p.down_mean, np.float64), np.asarray(p.up_mean, np.float64)
    return steps * np.asarray(p.step_time, np.float64) + size / down + size / up


def run_one(spec: SetupSpec, capability: str, method: str, seed: int, folder: Path,
            progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """One (set-up, capability, method, seed) run and what the tables and figure read."""
    exp = experiment(spec, capability, method, seed, folder)
    key = {"setup": spec.name, "capability": capability, "method": method, "seed": seed}
    try:
        history = simulate.run(
            exp.data,
            *exp.options(**{**exp.run_kwargs(), "seed": seed, "targets": (), "progress": progress}),
        )  # fmt: skip
    except Diverged as err:  # kept as a row the tables leave out and the report names
        return {**key, "diverged": str(err), "algorithm": exp.config["algorithm"]}
    s = jax.device_get(history.schedule)
    selected, valid = np.asarray(s.selected), np.asarray(s.valid)
    counts = np.bincount(selected[valid], minlength=exp.data.num_clients)
    clock = np.concatenate([[0.0], np.asarray(s.clock, np.float64)])  # after r rounds
    curve = [
        {"round": line["round"], "virtual_s": float(clock[line["round"]]),
         "acc": line["test_accuracy"]}
        for line in history.metrics
        if "test_accuracy" in line
    ]  # fmt: skip
    return {
        **key, "rounds": spec.rounds, "target": spec.target,
        "best_accuracy": history.summary["best_test_accuracy"],
        "final_accuracy": history.summary["final_test_accuracy"],
        "mean_round_s": float(np.mean(np.asarray(s.duration))),
        "virtual_s": history.summary["virtual_s"],
        "participation": counts.tolist(),
        "exchange_s": exchange_seconds(exp).tolist(),
        "curve": curve, "outcomes": history.summary["outcomes"],
        "algorithm": exp.config["algorithm"], "selection": exp.config.get("selection"),
        "warnings": history.summary["warnings"], "wall_s": history.summary["wall_s"],
    }  # fmt: skip


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    path = out / "results.json"
    rows = common.earlier_runs(path, args.resume)
    done = {(r["setup"], r["capability"], r["method"], r["seed"]) for r in rows}
    specs = SCALES[args.scale]
    cells = itertools.product(args.capabilities, args.setups, range(args.seeds), args.methods)
    for capability, name, seed, method in cells:
        if (name, capability, method, seed) in done:
            continue
        print(f"== {name} / {capability} / {method} / seed {seed}", flush=True)
        row = run_one(specs[name], capability, method, seed, out / "profiles", args.progress)
        rows.append(row)
        print(f"   {row['diverged']}" if "diverged" in row else f"   best "
              f"{row['best_accuracy']:.3f} round {row['mean_round_s']:.1f} s wall "
              f"{row['wall_s']:.0f} s", flush=True)  # fmt: skip
        setups = {k: dataclasses.asdict(v) for k, v in specs.items()}
        common.write_json(path, common.record(args, setups=setups, runs=rows))
    report(out)


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (set-up, capability, method): mean, std (n - 1, the paper's) and min-max over seeds
    of best accuracy and mean round length; rounds and virtual seconds to the target over the
    seeds that reached it, and how many did."""
    cells = common.group_by(runs, lambda r: (r["setup"], r["capability"], r["method"]))
    table = []
    for (setup, capability, method), cell in cells.items():
        hits = [h for h in (common.first_hit(r, r["target"]) for r in cell) if h is not None]
        entry = {"setup": setup, "capability": capability, "method": method,
                 "seeds": len(cell), "target": cell[0]["target"], "reached": len(hits)}  # fmt: skip
        for key, values in (
            ("best_accuracy", [100 * r["best_accuracy"] for r in cell]),
            ("mean_round_s", [r["mean_round_s"] for r in cell]),
            ("rounds_to_target", [h["round"] for h in hits]),
            ("time_to_target", [h["virtual_s"] for h in hits]),
        ):
            a = np.asarray(values, np.float64)
            std = float(a.std(ddof=1)) if a.size > 1 else 0.0
            entry[key] = (float(a.mean()), std, float(a.min()), float(a.max())) if a.size else None
        table.append(entry)
    return table


def _cell(value, fmt: str = "{:.2f}") -> str:  # mean (std)
    return "-" if value is None else f"{fmt.format(value[0])} ({fmt.format(value[1])})"


def _paper(setup: str, method: str, i: int) -> str:
    value = PAPER.get(setup, {}).get(method, (None,) * 4)[i]
    return "-" if value is None else f"{value:g}"


def markdown(table: list[dict[str, Any]]) -> list[str]:
    """Table III/IV per (set-up, capability) beside the paper's, round lengths also / FedAvg's."""
    lines = []
    for (setup, capability), rows in common.group_by(
        table, lambda e: (e["setup"], e["capability"])
    ).items():
        base = next((e["mean_round_s"][0] for e in rows if e["method"] == "fedavg"), math.nan)
        paper_base = PAPER.get(setup, {}).get("fedavg", (None, math.nan))[1]
        lines += [
            (f"\n### {setup}, capabilities {capability} (target accuracy {rows[0]['target']:g}; "
             f"paper's {PAPER_TARGET.get(setup, math.nan):g})\n"),
            ("| method | best acc % | paper | round s | / FedAvg | paper / FedAvg "
             "| rounds to target | paper | virtual s to target | paper | seeds reached |"),
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for e in rows:
            paper_len = PAPER.get(setup, {}).get(e["method"], (None, None))[1]
            paper_ratio = "-" if paper_len is None else f"{paper_len / paper_base:.2f}"
            lines.append(
                f"| {METHODS.get(e['method'], e['method'])} | {_cell(e['best_accuracy'])} "
                f"| {_paper(setup, e['method'], 0)} | {_cell(e['mean_round_s'], '{:.1f}')} "
                f"| {e['mean_round_s'][0] / base:.2f} | {paper_ratio} "
                f"| {_cell(e['rounds_to_target'], '{:.1f}')} | {_paper(setup, e['method'], 2)} "
                f"| {_cell(e['time_to_target'], '{:.0f}')} | {_paper(setup, e['method'], 3)} "
                f"| {e['reached']}/{e['seeds']} |"
            )
    return lines


def orderings(table: list[dict[str, Any]]) -> list[str]:
    """The paper's orderings, each checked on the means over seeds per (set-up, capability)."""
    checks = (
        ("Freezing's round shorter than FedAvg's", "mean_round_s", "freezing", "<", "fedavg"),
        ("w/ CS's round shorter than Freezing's", "mean_round_s", "freezing_cs", "<", "freezing"),
        ("w/ CS,WR's round longer than w/ CS's", "mean_round_s", "freezing_cs_wr", ">",
         "freezing_cs"),
        ("w/ CS,WR's round shorter than Freezing's", "mean_round_s", "freezing_cs_wr", "<",
         "freezing"),
        ("RBCS-F's round the shortest of Table III", "mean_round_s", "rbcs_f", "min", None),
        ("Freezing's accuracy at least FedAvg's", "best_accuracy", "freezing", ">=", "fedavg"),
        ("w/ CS,WR's accuracy above w/ CS's", "best_accuracy", "freezing_cs_wr", ">",
         "freezing_cs"),
        ("RBCS-F's accuracy below Freezing's", "best_accuracy", "rbcs_f", "<", "freezing"),
        ("FjORD's accuracy the lowest of Table III", "best_accuracy", "fjord", "min", None),
        ("FjORD's round shorter than FedAvg's", "mean_round_s", "fjord", "<", "fedavg"),
        ("FjORD w/ CS's round shorter than FjORD's", "mean_round_s", "fjord_cs", "<", "fjord"),
        ("FjORD w/ CS's accuracy above FjORD's", "best_accuracy", "fjord_cs", ">", "fjord"),
        ("Freezing's time to target below FedAvg's", "time_to_target", "freezing", "<", "fedavg"),
    )  # fmt: skip
    table3 = ("fedavg", "freezing", "freezing_cs", "freezing_cs_wr", "rbcs_f", "fjord")
    lines = ["\n| ordering (paper: holds on both data sets) | " + " | ".join(
        f"{s} {c}" for s, c in dict.fromkeys((e["setup"], e["capability"]) for e in table)
    ) + " |"]  # fmt: skip
    lines.append("|---" * (1 + lines[0].count(" | ")) + "|")
    groups = common.group_by(table, lambda e: (e["setup"], e["capability"]))
    for text, key, a, op, b in checks:
        cells = []
        for rows in groups.values():
            mean = {e["method"]: (e[key] or (math.nan,))[0] for e in rows}
            three = [mean[m] for m in table3 if m in mean]
            if a not in mean or (b is not None and b not in mean) or math.isnan(mean[a]):
                cells.append("n/a")
                continue
            holds = mean[a] <= min(three) if op == "min" else COMPARE[op](mean[a], mean[b])
            cells.append("yes" if holds else "**no**")
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return lines


def write_csv(table: list[dict[str, Any]], path: Path) -> None:
    """One line per (set-up, capability, method): mean, std, min, max of each figure."""
    keys = ("best_accuracy", "mean_round_s", "rounds_to_target", "time_to_target")
    head = ["setup", "capability", "method", "seeds", "target", "reached"]
    head += [f"{k}_{s}" for k in keys for s in ("mean", "std", "min", "max")]
    lines = [",".join(head)]
    for e in table:
        values = [e[k] for k in head[:6]]
        values += [("" if e[k] is None else f"{v:.6g}") for k in keys for v in (e[k] or (0,) * 4)]
        lines.append(",".join(str(v) for v in values))
    path.write_text("\n".join(lines) + "\n")


def plot_participation(runs: list[dict[str, Any]], path: Path) -> None:
    """Fig. 4: selections per capability group, summed over seeds, per (set-up, capability)."""
    groups = common.group_by(runs, lambda r: (r["setup"], r["capability"]))
    figure = common.figure(path, dpi=110, nrows=1, ncols=len(groups),
                           figsize=(5.5 * len(groups), 4.2), squeeze=False)  # fmt: skip
    with figure as (_, axes):
        for ax, ((setup, capability), cell) in zip(axes[0], groups.items()):
            for method, per_method in common.group_by(cell, lambda r: r["method"]).items():
                total = np.zeros(BINS)
                for r in per_method:
                    order = np.argsort(-np.asarray(r["exchange_s"]), kind="stable")  # slowest first
                    bins = np.array_split(np.asarray(r["participation"])[order], BINS)
                    total += [b.sum() for b in bins]
                style = "-" if method.startswith(("freezing", "rbcs")) else ":"
                ax.plot(np.arange(1, BINS + 1), total, style, marker="o", ms=3,
                        label=METHODS.get(method, method))  # fmt: skip
            ax.set(xlabel="capability group (1 = slowest)", ylabel="selections (sum over seeds)",
                   title=f"{setup}, {capability}")  # fmt: skip
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7)


def report(out: Path) -> None:
    """Prints and writes ``table.md`` (Tables III/IV, orderings), ``summary.csv``, the figure."""
    record = json.loads((out / "results.json").read_text())
    runs = [r for r in record["runs"] if "diverged" not in r]
    table = summarise(runs)
    lines = [
        ("Best accuracy and round length: mean (std over seeds); round s: the mean round's "
         "virtual seconds; to target: over the seeds that reached it."),
        *markdown(table),
        *orderings(table),
        *(f"\nDiverged (left out): {r['setup']} {r['capability']} {r['method']} seed "
          f"{r['seed']}: {r['diverged']}" for r in record["runs"] if "diverged" in r),
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "table.md").write_text(text)
    write_csv(table, out / "summary.csv")
    plot_participation(runs, out / "participation.png")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="scale", action="store_const", const="quick",
                      help="every row at tiny size: both data sets, uniform6x, 1 seed")  # fmt: skip
    size.add_argument("--full", dest="scale", action="store_const", const="full",
                      help="Table I's sizes as far as the shipped data go (hours)")  # fmt: skip
    parser.set_defaults(scale="default")
    for name in ("--setups", "--capabilities", "--methods"):
        parser.add_argument(name, type=lambda s: s.split(","), default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--progress", action="store_true")
    common.add_output_flags(parser, OUT, resume=True)
    args = parser.parse_args(argv)
    quick = args.scale == "quick"
    args.setups = args.setups or list(SCALES["default"])
    args.capabilities = args.capabilities or (["uniform6x"] if quick else list(CAPABILITIES))
    args.methods = args.methods or list(METHODS)
    args.seeds = args.seeds or (1 if quick else 3)
    return args


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
