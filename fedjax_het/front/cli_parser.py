"""The ``fedjax-het`` command line: its subcommands, their arguments and help (``cli.main``
runs them)."""

from __future__ import annotations

import argparse

from fedjax_het.front import compare as compare_lib

_CONFIG_HELP = "a TOML config; keys left out take the defaults (see `fedjax-het config`)"
_SET_HELP = (
    "override one key, e.g. --set rounds=50 --set algorithm.client_lr=0.1 "
    "(values are TOML: 0.1, true, \"text\", [1, 2]); may be repeated"
)


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help=_CONFIG_HELP)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)


def _add_resume_args(parser: argparse.ArgumentParser, metavar: str, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an output directory that already holds files")
    parser.add_argument(
        "--resume", metavar=metavar,
        help=f"continue {what} from its checkpoint (its config.toml, unless a config or --set "
        "is given: then it must resolve to the same config)",
    )


def _add_report_out(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--out", help=f"where to save (default: a new runs/{what}-<data>-<time>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the report in an --out that holds one")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="fedjax-het",
        description="Cross-device federated learning simulation, one vectorised JAX program "
        "per round.",
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run_and_sweep(commands)
    _add_inspection(commands)
    _add_compare(commands)
    return main


def _add_run_and_sweep(commands) -> None:
    run = commands.add_parser(
        "run", help="run an experiment and write its results",
        description="Run an experiment: train, evaluate every eval_every rounds, and write "
        "config.toml, metrics.jsonl, summary.json, arrays.npz, data_summary.json and PNG plots "
        "to the output directory.",
    )
    _add_config_args(run)
    run.add_argument("--out", help="output directory (default: runs/<data>-<algorithm>-<time>)")
    _add_resume_args(run, "RUN_DIR", "a run directory")
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
        "--grid", action="append", metavar="KEY=VALUES",
        help="an axis: comma-separated TOML values (algorithm.client_lr=0.01,0.1) or an "
        "inclusive integer range (seed=0..3); may be repeated",
    )
    sweep.add_argument("--out", help="output directory (default: runs/sweep-<data>-<algorithm>-<time>)")
    _add_resume_args(sweep, "SWEEP_DIR", "a sweep's output directory")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument("--one-program", action="store_true",
                       help="refuse a grid that needs more than one compiled program")
    sweep.add_argument("--cells-at-once", type=int, metavar="N",
                       help="cells a program runs at once; more run in chunks through the same "
                       "program (default: all whose client states fit on the device)")


def _add_inspection(commands) -> None:
    """``config``, ``explain``, ``data describe`` and ``hetero describe``."""
    show = commands.add_parser(
        "config", help="print the resolved config",
        description="Print the config after defaults and --set overrides, as TOML; validates it.",
    )
    _add_config_args(show)
    show.add_argument("--all", action="store_true", help="every option, what it does and its "
                      "value, the optional tables commented out: a config to edit")
    explained = commands.add_parser("explain", help="what a config key does", description=(
        "Print a config key's description, type, allowed values, default and paper, in the "
        "config given or else in the choices that take it (explain algorithm.prox_mu)."))
    explained.add_argument("key", metavar="KEY", help="a config key, e.g. policy.deadline")
    _add_config_args(explained)

    data = commands.add_parser("data", help="inspect the federated dataset of a config")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    describe = data_commands.add_parser(
        "describe", help="print and save the partition diagnostics",
        description="Build the config's federated dataset and print its diagnostics: clients, "
        "sizes (min/median/max, Gini), label distribution distance to the global one; save "
        "data_summary.json and label_heatmap.png.",
    )
    _add_config_args(describe)
    _add_report_out(describe, "data")

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
    _add_report_out(describe, "hetero")
    describe.add_argument("--mc-rounds", type=int, default=3000,
                          help="rounds of the R-metric runs (paper: 3000)")
    describe.add_argument("--mc-trips", type=int, default=10_000,
                          help="client trips of the T-metric runs (paper: 10,000)")


def _add_compare(commands) -> None:
    compare = commands.add_parser(
        "compare", help="compare run directories: one plot of their curves and a table",
        description="Read run directories (a sweep's directory stands for its cell-NNN runs); "
        "runs whose configs differ only in seed form one group, drawn as mean and min-max band. "
        "Print a Markdown table (final and best accuracy, rounds, virtual hours and MB to the "
        "--target, virtual hours and MB in all, participation Gini) and save the plot.",
    )
    compare.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run or sweep directories")
    compare.add_argument("--x", choices=tuple(compare_lib.X_AXES), default="round",
                         help="the x axis (default: round)")
    compare.add_argument("--metric", default="test_accuracy",
                         help="the metrics.jsonl key to plot and tabulate (default: test_accuracy)")
    compare.add_argument("--target", type=float, help="a target value of the metric")
    compare.add_argument("--label", action="append", default=[], metavar="NAME",
                         help="a short name for each RUN_DIR, in order (else its config's "
                         "logging.name, else the keys that differ); may be repeated")
    compare.add_argument("--out", default="compare.png",
                         help="the plot's path (default: compare.png); the table goes beside "
                         "it as .md; existing files are kept unless --overwrite")
    compare.add_argument("--overwrite", action="store_true", help="replace existing files")
