"""The ``fedjax-het`` command.

    fedjax-het run [CONFIG.toml] [--set key=value ...] [--out DIR]
    fedjax-het sweep [CONFIG.toml] [--set key=value ...] --grid KEY=V1,V2,... [--grid KEY=A..B ...]
                     [--out DIR] [--one-program] [--cells-at-once N]
    fedjax-het config [CONFIG.toml] [--set key=value ...]
    fedjax-het data describe [CONFIG.toml] [--set key=value ...] [--out DIR]
    fedjax-het hetero describe [CONFIG.toml] [--set key=value ...] [--out DIR]

With no config file the default experiment runs (``fedjax_het.config.DEFAULTS``).
A config error stops the command with one line naming the key (and, for a
sweep, the grid cell), before anything is built or compiled.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedjax_het import config as config_lib
from fedjax_het import distributed, results
from fedjax_het.divergence import Diverged

_CONFIG_HELP = "a TOML config; keys left out take the defaults (see `fedjax-het config`)"
_SET_HELP = (
    "override one key, e.g. --set rounds=50 --set algorithm.client_lr=0.1 "
    "(values are TOML: 0.1, true, \"text\", [1, 2]); may be repeated"
)


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help=_CONFIG_HELP)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="fedjax-het",
        description="Cross-device federated learning simulation, one vectorised JAX program "
        "per round.",
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run an experiment and write its results",
        description="Run an experiment: train, evaluate every eval_every rounds, and write "
        "config.toml, metrics.jsonl, summary.json, arrays.npz, data_summary.json and PNG plots "
        "to the output directory.",
    )
    _add_config_args(run)
    run.add_argument("--out", help="output directory (default: runs/<data>-<algorithm>-<time>)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    sweep = commands.add_parser(
        "sweep", help="run a grid of experiments, as few compiled programs as it allows",
        description="Run every cell of the product of the --grid axes (each cell: the config, "
        "the --set overrides, then the cell's values). Cells that differ only in seed, the "
        "algorithm's hyperparameters and [system]/[policy] numbers share one compiled program; "
        "other keys (model, batch size, algorithm...) make separate programs, each compiled "
        "once. Writes cell-NNN/ run directories (re-runnable with `fedjax-het run "
        "cell-NNN/config.toml`), grid.csv, grid.json and grid.png.",
    )
    _add_config_args(sweep)
    sweep.add_argument(
        "--grid", action="append", required=True, metavar="KEY=VALUES",
        help="an axis: comma-separated TOML values (algorithm.client_lr=0.01,0.1) or an "
        "inclusive integer range (seed=0..3); may be repeated",
    )
    sweep.add_argument("--out", help="output directory (default: runs/sweep-<data>-<algorithm>-<time>)")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument("--one-program", action="store_true",
                       help="refuse a grid that needs more than one compiled program")
    sweep.add_argument("--cells-at-once", type=int, metavar="N",
                       help="cells a program runs at once; more run in chunks through the same "
                       "program (default: all whose client states fit on the device)")

    show = commands.add_parser(
        "config", help="print the resolved config",
        description="Print the config after defaults and --set overrides, as TOML; validates it.",
    )
    _add_config_args(show)

    data = commands.add_parser("data", help="inspect the federated dataset of a config")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    describe = data_commands.add_parser(
        "describe", help="print and save the partition diagnostics",
        description="Build the config's federated dataset and print its diagnostics: clients, "
        "sizes (min/median/max, Gini), label distribution distance to the global one; save "
        "data_summary.json and label_heatmap.png.",
    )
    _add_config_args(describe)
    describe.add_argument("--out", default="runs/data", help="where to save (default: runs/data)")

    hetero = commands.add_parser("hetero", help="inspect the system heterogeneity of a config")
    hetero_commands = hetero.add_subparsers(dest="hetero_command", required=True, metavar="ACTION")
    describe = hetero_commands.add_parser(
        "describe", help="FLHetBench metrics, the run's schedule, timeline and availability plots",
        description="Compute the six FLHetBench Monte-Carlo metrics of the config's [system] "
        "profiles (DevMC-R/T, StatMC-R/T, InterMC-R/T; paper constants unless overridden) and "
        "the run's schedule with its [policy], without training; print them and save "
        "system_summary.json, timeline.png, availability.png and participation.png.",
    )
    _add_config_args(describe)
    describe.add_argument("--out", default="runs/hetero", help="where to save (default: runs/hetero)")
    describe.add_argument("--mc-rounds", type=int, default=3000,
                          help="rounds of the R-metric runs (paper: 3000)")
    describe.add_argument("--mc-trips", type=int, default=10_000,
                          help="client trips of the T-metric runs (paper: 10,000)")
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "sweep":
        return _sweep(args)
    try:
        raw = config_lib.load(args.config, args.set)
        distributed.initialize(config_lib.cluster(raw))
        experiment = config_lib.build(raw)
        if args.command == "config":
            print(results.to_toml(experiment.config), end="")
            return 0
    except config_lib.ConfigError as err:
        return _config_error(err)
    if args.command == "data":
        return _describe_data(experiment, Path(args.out))
    if args.command == "hetero":
        return _describe_system(experiment, args)
    return _run(experiment, args)


def _run(experiment: config_lib.Experiment, args: argparse.Namespace) -> int:
    from fedjax_het import simulate

    out = args.out or _default_out(experiment.config)
    try:
        history = simulate.run(
            experiment.data, experiment.model, experiment.algorithm, experiment.sampler,
            **experiment.run_kwargs(), progress=not args.no_progress, out_dir=out,
            config=experiment.config,
        )
    except Diverged as err:
        if distributed.writes_results():
            print(f"fedjax-het: {err}; results so far in {out} (summary.json: status "
                  f"\"diverged\"); engine.nonfinite = \"drop\" leaves non-finite updates out",
                  file=sys.stderr)
        return 1
    s = history.summary
    if not distributed.writes_results():
        return 0
    print(
        f"final test accuracy {s['final_test_accuracy']:.4f} (best {s['best_test_accuracy']:.4f}), "
        f"per-client mean {s['client_accuracy_mean']:.4f}, worst {s['client_accuracy_min']:.4f}; "
        f"{s['rounds']} rounds in {s['wall_s']:.1f} s; results in {history.out_dir}"
    )
    return 0


def _config_error(err: config_lib.ConfigError) -> int:
    print(f"fedjax-het: config error: {err}", file=sys.stderr)
    return 2


def _sweep(args: argparse.Namespace) -> int:
    from fedjax_het import grid

    if args.cells_at_once is not None and args.cells_at_once < 1:
        print("fedjax-het: --cells-at-once must be >= 1", file=sys.stderr)
        return 2
    try:
        distributed.initialize(config_lib.cluster(config_lib.load(args.config, args.set)))
        axes = [grid.parse_axis(spec) for spec in args.grid]
        plan = grid.plan(args.config, args.set, axes, one_program=args.one_program)
    except config_lib.ConfigError as err:
        return _config_error(err)
    verb = "changes" if len(plan.splitting) == 1 else "change"
    changing = f" ({', '.join(plan.splitting)} {verb} the program)" if plan.splitting else ""
    print(f"{len(plan.cells)} cells, {len(plan.programs)} compiled program(s){changing}")
    out = Path(args.out or _default_out(plan.cells[0].config, "sweep-"))
    histories = grid.run(
        plan, out, progress=not args.no_progress, cells_at_once=args.cells_at_once
    )
    if not distributed.writes_results():
        return 0
    for history, cell in zip(histories, plan.cells):
        s = history.summary
        print(f"{history.out_dir.name}  {cell.name}: final test accuracy "
              f"{s['final_test_accuracy']:.4f} (best {s['best_test_accuracy']:.4f}), client p10 "
              f"{s['client_accuracy_p10']:.4f}")
    print(f"results in {out} (grid.csv, grid.json, grid.png, cell-NNN/)")
    return 0


def _describe_data(experiment: config_lib.Experiment, out: Path) -> int:
    from fedjax_het.data import diagnostics

    summary = diagnostics.save_report(experiment.data, out)
    print(diagnostics.format_report(summary))
    print(f"saved {out / 'data_summary.json'} and {out / 'label_heatmap.png'}")
    return 0


def _describe_system(experiment: config_lib.Experiment, args: argparse.Namespace) -> int:
    from fedjax_het import rng, simulate
    from fedjax_het.system import flhetbench, report

    if experiment.system is None:
        print("fedjax-het: config error: hetero describe needs a [system] or [policy] table",
              file=sys.stderr)
        return 2
    if args.mc_rounds < 1 or args.mc_trips < 1:
        print("fedjax-het: --mc-rounds and --mc-trips must be >= 1", file=sys.stderr)
        return 2
    config = experiment.config
    key = rng.seed_key(config["seed"])
    plans = simulate.plan_run(
        experiment.system, experiment.data, simulate.local_spec(
            experiment.model, experiment.algorithm, experiment.data, experiment.work
        ), experiment.sampler,
        rounds=config["rounds"], key=key,
    )
    mc = flhetbench.MonteCarlo(
        cohort_size=min(20, experiment.data.num_clients), rounds=args.mc_rounds,
        trips=args.mc_trips,
    )
    summary = report.describe(experiment.system.profiles, plans, args.out, key=key, mc=mc)
    print(report.format_report(summary))
    print(f"saved system_summary.json, timeline.png, availability.png, participation.png "
          f"in {args.out}")
    return 0


def _default_out(config: dict, prefix: str = "") -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{prefix}{config['data']['name']}-{config['algorithm']['name']}-{stamp}"
    return str(Path("runs") / name)


if __name__ == "__main__":
    sys.exit(main())
