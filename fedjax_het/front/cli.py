"""The ``fedjax-het`` command.

    fedjax-het run [CONFIG.toml] [--set key=value ...] [--out DIR] [--overwrite]
    fedjax-het run --resume RUN_DIR
    fedjax-het sweep [CONFIG.toml] [--set key=value ...] --grid KEY=V1,V2,... [--grid KEY=A..B ...]
                     [--out DIR] [--overwrite] [--one-program] [--cells-at-once N]
    fedjax-het sweep --resume SWEEP_DIR
    fedjax-het config [CONFIG.toml] [--set key=value ...] [--all]
    fedjax-het explain KEY [CONFIG.toml] [--set key=value ...]
    fedjax-het data describe [CONFIG.toml] [--set key=value ...] [--out DIR] [--overwrite]
    fedjax-het hetero describe [CONFIG.toml] [--set key=value ...] [--out DIR] [--overwrite]
    fedjax-het compare RUN_DIR... [--x round|virtual_hours|bytes|wall_s] [--metric KEY]
                       [--target VALUE] [--label NAME ...] [--out PLOT.png] [--overwrite]

With no config file the default experiment runs (``fedjax_het.front.config.DEFAULTS``).
A config error stops the command with one line naming the key (and, for a
sweep, the grid cell), before anything is built or compiled; so does an output
directory that cannot be used (a file, unwritable, or holding another run unless
``--overwrite``). Ctrl-C or SIGTERM stops a run after the block of rounds it is
computing, writes a checkpoint and the results so far, prints how to resume and
exits 130 / 143; ``--resume`` continues bit for bit, or extends (``--set rounds=N``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedjax_het import results
from fedjax_het.front import compare as compare_lib
from fedjax_het.front import config as config_lib
from fedjax_het.front import explain, logs, summary_lines
from fedjax_het.front.cli_parser import parser
from fedjax_het.results import NotWritten, OutDirError
from fedjax_het.training import checkpoint, compilation, distributed, interrupt
from fedjax_het.training.checkpoint import CheckpointError
from fedjax_het.training.divergence import Diverged
from fedjax_het.training.interrupt import Interrupted


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "compare":
        return _compare(args)
    try:
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "run" and args.resume:
            args.out = args.resume
            args.config = args.config or _stored_config(args.resume, "config.toml")
        raw = config_lib.load(args.config, args.set)
        if args.command == "explain":
            print(explain.explain(args.key, raw), end="")
            return 0
        distributed.initialize(config_lib.cluster(raw))
        compilation.configure(config_lib.compile_cache(raw))  # before build compiles anything
        experiment = config_lib.build(raw)
        if args.command == "config":
            print((explain.annotated if args.all else results.to_toml)(experiment.config), end="")
            return 0
        if args.command == "run":
            args.out = args.out if args.out is not None else _default_out(experiment.config)
            args.made_out = not os.path.exists(args.out)
            if distributed.writes_results():
                results.prepare_out_dir(args.out, overwrite=args.overwrite,
                                        resume=bool(args.resume))
            if args.resume:
                checkpoint.check_config(args.out, experiment.config)
    except config_lib.ConfigError as err:
        return _config_error(err)
    except (OutDirError, CheckpointError) as err:
        return _error(err)
    except KeyboardInterrupt:  # Ctrl-C while the data are prepared
        return _interrupted(Interrupted(trained=False), "", "")
    if args.command == "run":
        return _run(experiment, args)
    if args.command == "hetero" and experiment.system is None:
        return _error("config error: hetero describe needs a [system] or [policy] table")
    if args.command == "hetero" and (args.mc_rounds < 1 or args.mc_trips < 1):
        return _error("--mc-rounds and --mc-trips must be >= 1")
    if args.out is None:
        args.out = _default_out(experiment.config, f"{args.command}-")
    try:
        results.prepare_out_dir(args.out, overwrite=args.overwrite)
    except OutDirError as err:
        return _error(f"cannot write the report to {args.out}: {err}")
    try:
        if args.command == "data":
            return _describe_data(experiment, Path(args.out))
        return _describe_system(experiment, args)
    except OSError as err:
        return _error(f"cannot write the report to {args.out}: {err.strerror or err}")


def _compare(args: argparse.Namespace) -> int:
    figure = Path(args.out)
    markdown = figure.with_suffix(".md")
    taken = [str(p) for p in (figure, markdown) if p.exists()]
    if taken and not args.overwrite:
        return _error(f"{' and '.join(taken)} already exist; choose another --out or --overwrite")
    try:
        comparison = compare_lib.compare(args.runs, x=args.x, metric=args.metric,
                                         target=args.target, figure=figure, labels=args.label)
        markdown.write_text(comparison.table + "\n")
    except (ValueError, FileNotFoundError) as err:
        return _error(err)
    except OSError as err:
        return _error(f"cannot write {figure}: {err.strerror or err}")
    print(comparison.table)
    print(f"plot: {figure}; table: {markdown}")
    return 0


def _stored_config(directory: str, name: str) -> str:
    """The config a run or sweep directory was started with (``name`` inside it)."""
    path = Path(directory) / name
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {name}: it is not a run or sweep to resume")
    return str(path)


def _run_mediated(experiment: config_lib.Experiment, args: argparse.Namespace) -> int:
    """``algorithm.name = "gandalf" | "mediator"``: ``gandalf.run_in_dir``."""
    from fedjax_het.gandalf import run_dir

    system, kwargs = experiment.system, experiment.run_kwargs()
    try:
        with compilation.applied(kwargs["matmul_precision"], kwargs["compile_cache"]):
            result = run_dir.run_in_dir(
                experiment.data, experiment.model, experiment.algorithm, experiment.mediated,
                out_dir=args.out, config=experiment.config, resume=bool(args.resume),
                checkpoint_every=kwargs["checkpoint_every"],
                rounds=kwargs["rounds"], work=experiment.work, hyper=experiment.hyper,
                seed=kwargs["seed"], eval_every=kwargs["eval_every"],
                profiles=None if system is None else system.profiles,
                start=0.0 if system is None else float(system.policy.start),
                targets=(0.5, 0.6, 0.7, 0.8), progress=not args.no_progress,
            )
    except Interrupted as err:
        return _interrupted(err, f"fedjax-het run --resume {args.out}", args.out)
    except (ValueError, CheckpointError) as err:
        return _error(err)
    except NotWritten as err:
        return _error(err, 1)
    s = result.summary
    print(f"best test accuracy {s['best_accuracy']:.4f} (final {s['final_accuracy']:.4f}); "
          f"{s['rounds']} rounds, mean round {s['mean_round_s']:.1f} virtual s, failure rate "
          f"{s['failure_rate']:.3f}, {s['synthetic_rows']} synthetic rows; results in {args.out}")
    return 0


def _run(experiment: config_lib.Experiment, args: argparse.Namespace) -> int:
    from fedjax_het.training import simulate

    if experiment.mediated is not None:
        return _run_mediated(experiment, args)
    out = args.out
    for note in experiment.notes:  # before the progress bar, which counts the rounds run
        print(f"note: {note}", file=sys.stderr)
    try:
        history = logs.logged(
            lambda on_eval: simulate.run(
                experiment.data,
                *experiment.options(
                    progress=not args.no_progress,
                    out_dir=out,
                    config=experiment.config,
                    resume=bool(args.resume),
                    overwrite=args.overwrite,
                    on_eval=on_eval,
                ),
            ),
            experiment.config,
            out,
        )
    except Diverged as err:
        if distributed.writes_results():
            print(f"fedjax-het: {err}; results so far in {out} (summary.json: status "
                  f"\"diverged\"); engine.nonfinite = \"drop\" leaves non-finite updates out",
                  file=sys.stderr)
        return 1
    except Interrupted as err:
        return _interrupted(err, f"fedjax-het run --resume {out}", out)
    except NotWritten as err:
        return _error(err, 1)
    except (OutDirError, CheckpointError) as err:
        return _error(err)
    except config_lib.ConfigError as err:  # found while planning: memory, availability
        if getattr(args, "made_out", False) and not any(Path(out).iterdir()):
            Path(out).rmdir()  # made for this run, which never started
        return _config_error(err)
    s = history.summary
    if not distributed.writes_results():
        return 0
    steps = "server events" if "staleness_histogram" in s else "rounds"
    print(
        f"final test accuracy {s['final_test_accuracy']:.4f} (best {s['best_test_accuracy']:.4f}), "
        f"per-client mean {s['client_accuracy_mean']:.4f}, worst {s['client_accuracy_min']:.4f}; "
        f"{s['rounds']} {steps} in {s['wall_s']:.1f} s; results in {history.out_dir}"
    )
    for line in summary_lines.system_lines(s, experiment.data.num_clients, steps.split()[-1][:-1]):
        print(line)
    for line in [*(f"note: {n}" for n in experiment.notes), *(f"warning: {w}" for w in
                                                                s.get("warnings", ()))]:
        print(line, file=sys.stderr)
    if "staleness_histogram" in s:
        print(
            f"asynchronous server: {s['applied']} updates applied, {s['discarded']} discarded as "
            f"too stale, {s['dropped']} tasks failed; staleness histogram "
            f"{s['staleness_histogram']}; {s['virtual_s'] / 3600:.2f} virtual hours"
        )
    if "privacy" in s:
        p = s["privacy"]
        print(
            f"privacy: epsilon {p['epsilon']:.3g} at delta {p['delta']:g} (noise multiplier "
            f"{p['noise_multiplier']:g}, clip {p['clip_norm']:g}, {p['rounds']} rounds at "
            f"q = {p['sampling_rate']:.3g}; {p['epsilon_fixed_size']:.3g} for the fixed-size cohort)"
        )
    return 0


def _interrupted(err: Interrupted, resume: str, out: str | Path) -> int:
    interrupt.ignore_further_sigint()
    if distributed.writes_results():
        print(f"fedjax-het: {err.describe(out, resume)}", file=sys.stderr)
    return err.exit_code


def _error(err: Exception | str, code: int = 2) -> int:
    print(f"fedjax-het: {err}", file=sys.stderr)
    return code


def _config_error(err: config_lib.ConfigError) -> int:
    print(f"fedjax-het: config error: {err}", file=sys.stderr)
    return 2


def _sweep(args: argparse.Namespace) -> int:
    from fedjax_het.front import grid

    if args.cells_at_once is not None and args.cells_at_once < 1:
        print("fedjax-het: --cells-at-once must be >= 1", file=sys.stderr)
        return 2
    if not args.grid and not args.resume:
        return _error("sweep needs at least one --grid axis (or --resume SWEEP_DIR)")
    if args.resume:  # the command the sweep was started with, recorded in its directory
        stored = json.loads(Path(_stored_config(args.resume, grid.COMMAND)).read_text())
        args.config, args.set, args.grid = stored["config"], stored["set"], stored["grid"]
        args.cells_at_once, args.one_program = stored["cells_at_once"], stored["one_program"]
        args.out = args.resume
    try:
        raw = config_lib.load(args.config, args.set)
        distributed.initialize(config_lib.cluster(raw))
        compilation.configure(config_lib.compile_cache(raw))  # before the cells are built
        axes = [grid.parse_axis(spec) for spec in args.grid or ()]
        plan = grid.plan(args.config, args.set, axes, one_program=args.one_program)
        out = Path(args.out or _default_out(plan.cells[0].config, "sweep-"))
        if distributed.writes_results():
            results.prepare_out_dir(out, overwrite=args.overwrite, resume=bool(args.resume))
    except config_lib.ConfigError as err:
        return _config_error(err)
    verb = "changes" if len(plan.splitting) == 1 else "change"
    changing = f" ({', '.join(plan.splitting)} {verb} the program)" if plan.splitting else ""
    print(f"{len(plan.cells)} cells, {len(plan.programs)} compiled program(s){changing}")
    command = {"config": args.config and str(Path(args.config).resolve()), "set": args.set,
               "grid": args.grid, "cells_at_once": args.cells_at_once,
               "one_program": args.one_program}
    try:
        histories = grid.run(
            plan, out, progress=not args.no_progress, cells_at_once=args.cells_at_once,
            command=command, resume=bool(args.resume), overwrite=args.overwrite,
        )
    except Interrupted as err:
        return _interrupted(err, f"fedjax-het sweep --resume {out}", out)
    except NotWritten as err:
        return _error(err, 1)
    except CheckpointError as err:
        return _error(err)
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
    from fedjax_het import rng
    from fedjax_het.system import flhetbench, report
    from fedjax_het.training import simulate

    config = experiment.config
    key = rng.seed_key(config["seed"])
    plans = lambda: simulate.plan_run(
        experiment.system, experiment.data, simulate.local_spec(
            experiment.model, experiment.algorithm, experiment.data, experiment.work
        ), experiment.sampler,
        rounds=config["rounds"], key=key,
    )
    mc = flhetbench.MonteCarlo(
        cohort_size=min(20, experiment.data.num_clients), rounds=args.mc_rounds,
        trips=args.mc_trips,
    )
    summary = report.describe(experiment.system.profiles, plans, args.out, key=key, mc=mc,
                              policy=experiment.system.policy)
    print(report.format_report(summary))
    print(f"saved system_summary.json, timeline.png, availability.png, participation.png "
          f"in {args.out}")
    return 0


def _default_out(config: dict, prefix: str = "") -> str:
    """``runs/<prefix><data>-<algorithm>-<time>`` (``data describe``'s without the algorithm,
    which it does not use), with ``-2``, ``-3``... if that exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    what = [config["data"]["name"], *([] if prefix == "data-" else [config["algorithm"]["name"]])]
    base = Path("runs") / f"{prefix}{'-'.join(what)}-{stamp}"
    out, copy = base, 1
    while out.exists():
        copy += 1
        out = base.with_name(f"{base.name}-{copy}")
    return str(out)


if __name__ == "__main__":
    sys.exit(main())
