"""``run``'s options, as four frozen groups (docs/design.md §3).

``fedjax_het.run(data, training, timing, engine, output)`` takes them as they travel:
``Training`` (what is trained, by which algorithm, on whom, for how long), ``Timing``
(device timings and the server that follows them), ``Engine`` (how the rounds run on the
devices) and ``Output`` (what the run writes and reports). ``run_options`` builds the four
from flat keywords, each field taking the keyword of its name (a config's keys, the tests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fedjax_het.data.batching import LocalWork
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.hooks import Freezing
from fedjax_het.models import Model
from fedjax_het.system.events import AsyncServer
from fedjax_het.system.sampler import LearnedSelect, Sampler
from fedjax_het.system.setup import System
from fedjax_het.training.compilation import DEFAULT_MATMUL_PRECISION


@dataclasses.dataclass(frozen=True)
class Training:
    """What a run trains, by which algorithm, on whom, and for how long.

    Attributes:
      model: the model (``fedjax_het.models.Model``).
      algorithm: the federated algorithm.
      sampler: who takes part in a round (the cohort's selection without a system).
      rounds: number of rounds.
      work: local work per selected client (batch size, epochs or steps).
      hyper: overrides of the algorithm's traced hyperparameters.
      seed: the run's root seed.
      eval_every: rounds per ``lax.scan`` block between evaluations.
      weighting: "examples" (FedAvg's n_k) or "uniform".
      nonfinite: "stop": a round whose training loss, or a client's update, is not
        finite (or a global model whose test loss is not) ends the run after its
        block: the results so far are written, ``summary["status"]`` is "diverged"
        and :class:`~fedjax_het.training.divergence.Diverged` is raised (its ``history`` holds
        them). "drop": non-finite client updates enter at weight 0 and are counted
        (``nonfinite_updates``); a non-finite loss or model still stops the run.
    """

    model: Model
    algorithm: FederatedAlgorithm
    sampler: Sampler
    rounds: int
    work: LocalWork
    hyper: Mapping[str, float] | None = None
    seed: int = 0
    eval_every: int = 10
    weighting: str = "examples"
    nonfinite: str = "stop"


@dataclasses.dataclass(frozen=True)
class Engine:
    """How the rounds run on the devices.

    Attributes:
      chunk: clients per ``vmap`` chunk (None: ``cohort.auto_chunk``'s preference, lowered
        to what fits the device's free memory, ``memory.plan_chunk``). Either way a
        round that cannot fit is refused with one line before compiling.
      unroll: local-step scan unrolling.
      eval_batch_size: rows per evaluation batch.
      client_state: where an algorithm's per-client states live: "device",
        "host" (only the rows of clients ever selected, in host memory, moved
        in and out of the round by callbacks; bit-identical results) or "auto"
        (the device when they fit comfortably, else the host). A state that
        fits nowhere is refused before compiling (``client_store.plan_client_state``).
      devices: shard each cohort over this many of ``jax.devices()`` (None: all of
        them; after ``jax.distributed.initialize``, every host's). Results match one
        device up to float summation order; ``DeviceStore`` client states are sharded
        by client too.
      precision: "float32"; "bfloat16" for local training in bfloat16 with float32
        master params and aggregation (``local.compute_model``); "float64" for the whole
        run in float64: params, hyperparameters, training, aggregation and evaluation
        (``local.run_model``; needs ``jax_enable_x64``), on the float32 run's schedule
        (the simulated network still carries float32 updates).
      matmul_precision: "highest", "high" or "default": ``jax.default_matmul_precision``
        while the run traces its programs (``training.compilation``; on CPU all three are
        the same arithmetic, on GPU "default" is TF32 and "high" bf16x3).
      compile_cache: keep compiled programs in the persistent compilation cache
        (``compilation.cache_dir()``), so that the next process running the same config
        loads them instead of compiling; False: the cache off for this process.
        ``summary["compile_cache"]`` counts what the run compiled and loaded.
      conv: how a convolutional model's convolutions run in local training
        (``fedjax_het.convolution``): "xla", "patches" (im2col and a matmul: a vmapped
        chunk's are a batched matmul), or "auto": the plan's choice for the backend and
        chunk (``conv_choice.conv_impl_for``). Ignored by a model that offers no choice.
    """

    chunk: int | None = None
    unroll: int = 1
    eval_batch_size: int = 1024
    client_state: str = "auto"
    devices: int | None = None
    precision: str = "float32"
    matmul_precision: str = DEFAULT_MATMUL_PRECISION
    compile_cache: bool = True
    conv: str = "auto"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Device timings, and the server that follows them.

    Attributes:
      system: device and state heterogeneity (``fedjax_het.system.setup.System``).
        The whole run's schedule is computed first (``system.schedule``, no
        training); training then follows it: selected clients, partial work as
        step masks, failed clients at weight 0. Adds the virtual clock, outcome
        counts, bytes and wasted work to the metrics.
      select: a selection that learns (``sampler.LearnedSelect``, e.g.
        ``sampling.power_of_choice``), given the server's per-client record. It,
        and an algorithm with ``freezing`` (FreezeFL), need a ``system``; the
        schedule is then computed round by round inside the training loop
        (``fedjax_het.training.online``) instead of before it.
      server: an asynchronous server (``system.events.async_server``; needs a ``system``):
        ``rounds`` are then server events, each aggregating the server's ``buffer_size``
        arrivals, each trained from the model version it downloaded (``plan_events``, a ring
        of ``max_staleness + 1`` recent models). The metrics add applied, discarded and
        dropped updates, concurrency and staleness (``metrics.EventAccounting``).
    """

    system: System | None = None
    select: LearnedSelect | None = None
    server: AsyncServer | None = None

    def in_loop(self, algorithm: FederatedAlgorithm) -> bool:
        """Whether the schedule is computed round by round inside the training loop (a
        learned select, or ``algorithm`` freezes by device timing)."""
        return self.select is not None or algorithm.hook(Freezing) is not None

    def check(self, algorithm: FederatedAlgorithm) -> None:
        """Refuses the combinations no run trains (ValueError)."""
        if self.server is not None:
            if self.system is None:
                raise ValueError("an asynchronous server runs on device timings; give run a system")
            if self.in_loop(algorithm):
                raise ValueError(
                    "an asynchronous server takes neither a learned select nor an algorithm "
                    f"that freezes by device timing ({algorithm.name}); run them with a "
                    "synchronous server"
                )
        elif self.in_loop(algorithm):
            if self.system is not None and self.system.policy.max_staleness:
                raise ValueError(
                    "stale tasks (policy.max_staleness) run with a schedule computed "
                    "before training: not with a learned select or in-round freezing"
                )
            if self.system is None:
                raise ValueError(
                    f"a learned select and {algorithm.name}'s freezing choose from device "
                    "timings; give run a system"
                )


@dataclasses.dataclass(frozen=True)
class Output:
    """What a run writes and reports.

    Attributes:
      progress: show a progress bar.
      out_dir: write ``config.toml``, ``metrics.jsonl``, ``summary.json`` and
        ``curves.png`` there (process 0 only, in a multi-process run).
      config: the resolved config to record in ``out_dir`` (the CLI passes its own).
      on_eval: called with each evaluation's metrics dict.
      targets: test accuracies whose first round, virtual time and wall time
        the summary reports (``to_accuracy``).
      checkpoint_every: with ``out_dir``, write ``out_dir/checkpoint.npz``
        (``fedjax_het.training.checkpoint``) at the first evaluation at or past every multiple
        of this many rounds (0: only at the end and on an interrupt).
      resume: continue the run in ``out_dir`` from its checkpoint: the results are bit
        for bit those of the uninterrupted run (wall times aside). Refused
        (``checkpoint.CheckpointError``) if ``config`` differs from the checkpoint's
        or the checkpoint's arrays do not fit this run.
      overwrite: write into an ``out_dir`` that already holds files (refused otherwise,
        ``results.OutDirError``).
    """

    progress: bool = True
    out_dir: str | Path | None = None
    config: Mapping[str, Any] | None = None
    on_eval: Callable[[dict[str, Any]], None] | None = None
    targets: Sequence[float] = (0.5, 0.6, 0.7, 0.8)
    checkpoint_every: int = 0
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.resume and self.out_dir is None:
            raise ValueError("resume continues the run in out_dir; give run its out_dir")


class RunOptions(NamedTuple):
    """``run``'s four groups, in its order: ``run(data, *run_options(...))``."""

    training: Training
    timing: Timing
    engine: Engine
    output: Output


def run_options(**keywords: Any) -> RunOptions:
    """The four groups from flat ``keywords``: each field takes the keyword of its name (left
    out: its default); a keyword no group has is refused.

    >>> from fedjax_het import models
    >>> from fedjax_het.algorithms import fedavg
    >>> from fedjax_het.sampling import uniform
    >>> options = run_options(
    ...     model=models.mlp((4,), 2), algorithm=fedavg(), sampler=uniform(10, 2),
    ...     rounds=3, work=LocalWork(batch_size=5), progress=False)
    >>> options.training.rounds, options.output.progress, options.engine.chunk
    (3, False, None)
    """
    groups = [Training, Timing, Engine, Output]
    names = {field.name for group in groups for field in dataclasses.fields(group)}
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise TypeError(f"run has no option {', '.join(map(repr, unknown))}")
    return RunOptions(*(
        group(**{f.name: keywords[f.name] for f in dataclasses.fields(group) if f.name in keywords})
        for group in groups
    ))
