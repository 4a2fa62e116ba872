"""A run's programs (docs/design.md §3): ``Setup`` checks the arguments ``run`` and
``sweep`` share, plans the client states' placement and the chunk size before anything
compiles (``memory.plan_memory``), builds the round, and jits its two programs: a block
of rounds (one ``lax.scan``) and the evaluation, for one run or over a sweep's cells.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import client_store, conv_choice, memory, step_cost
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.cohort import client_mesh
from fedjax_het.engine.hooks import Personalized
from fedjax_het.engine.local import DeviceSplit, hyper_dtype, run_model
from fedjax_het.engine.round import Round, RunState, device_split, init_state
from fedjax_het.models import Model
from fedjax_het.system.sampler import Sampler
from fedjax_het.system.schedule import Schedule
from fedjax_het.training.divergence import NONFINITE
from fedjax_het.training.metrics import evaluate, evaluate_personal
from fedjax_het.training.plan import local_spec, steps_needed
from fedjax_het.typing import Hyper, PRNGKey, PyTree


@dataclasses.dataclass(frozen=True)
class Setup:
    """A validated simulation: the round, its traced inputs, and the evaluation data."""

    data: FederatedData
    round: Round
    hyper: Hyper
    train: DeviceSplit
    test: DeviceSplit
    test_row_client: jax.Array
    eval_batch_size: int
    max_test_count: int
    state_plan: client_store.StatePlan
    chunk_plan: memory.ChunkPlan

    @classmethod
    def build(
        cls,
        data: FederatedData,
        model: Model,
        algorithm: FederatedAlgorithm,
        sampler: Sampler,
        *,
        rounds: int,
        work: LocalWork,
        hyper: Mapping[str, float] | None,
        eval_every: int,
        chunk: int | None,
        unroll: int,
        weighting: str,
        eval_batch_size: int,
        client_state: str = "auto",
        slots: int | None = None,
        runs: int = 1,
        precision: str = "float32",
        devices: int | None = None,
        nonfinite: str = "stop",
        ring_depth: int = 0,
        system: bool = False,
        conv: str = "auto",
    ) -> Setup:
        """Checks the arguments ``run`` and ``sweep`` share and builds the round.

        The client states' placement and the chunk are planned before anything compiles
        (``memory.plan_memory``; a round that cannot fit is refused in one line): ``slots``
        (default: the cohort) clients a round at most, ``runs`` runs at once, each device
        running its share. ``ring_depth`` > 0 keeps that many recent broadcasts for slots
        that train from older versions (``Round.ring_depth``). ``system``: work varies.
        ``conv``: how local training convolves (``conv_choice.conv_impl_for``; the plan's choice is
        ``chunk_plan.conv``); evaluation keeps the model's own convolution.
        """
        _check(data, sampler, rounds, eval_every, weighting, nonfinite)
        plain, model = model, run_model(model, precision)
        mesh = client_mesh(devices)
        trained = _trained_model(plain, model, chunk, conv, precision)[0]  # chunk not yet planned
        spec = local_spec(trained, algorithm, data, work, unroll=unroll, precision=precision)
        hyper_ = algorithm.hyper(hyper, dtype=hyper_dtype(precision))
        train, test = device_split(data.train), device_split(data.test)
        resident = client_store.tree_bytes(test) + _ring_bytes(
            model, algorithm, hyper_, data.num_clients, ring_depth
        )
        state_plan, chunk_plan = memory.plan_memory(
            spec, hyper_, train, num_clients=data.num_clients, rounds=rounds,
            slots=slots or sampler.cohort_size, placement=client_state, runs=runs,
            devices=1 if mesh is None else mesh.size, chunk=chunk, resident=resident,
            in_place=not ring_depth, work_varies=system or _ragged(spec, data),
        )  # fmt: skip
        trained, chosen = _trained_model(plain, model, chunk_plan.chunk, conv, precision)
        spec = dataclasses.replace(spec, model=trained)
        chunk_plan = dataclasses.replace(chunk_plan, conv=chosen)
        round_ = Round(
            model,
            algorithm,
            sampler,
            spec,
            chunk=chunk_plan.chunk,
            weighting=weighting,
            store=state_plan.store(mesh),
            mesh=mesh,
            drop_nonfinite=nonfinite == "drop",
            ring_depth=ring_depth,
        )
        return cls(
            data,
            round_,
            hyper_,
            train,
            test,
            jnp.asarray(data.test.client_ids),
            eval_batch_size,
            int(data.test.count.max(initial=0)),
            state_plan,
            chunk_plan,
        )

    def init(self, key: PRNGKey, *, cells: bool = False, hyper: Hyper | None = None) -> RunState:
        """The initial state (one per key of ``key [cells]`` with ``cells``).

        ``hyper``: the hyperparameters, stacked ``[cells]`` with ``cells`` (each cell its
        own); None: this setup's, for every cell.
        """
        r = self.round
        init = functools.partial(
            init_state,
            r.model,
            r.algorithm,
            self.data.num_clients,
            store=r.store,
            ring_depth=r.ring_depth,
        )
        init = jax.vmap(init) if cells else init
        return self.on_mesh(jax.jit(init)(self._hyper(key, cells, hyper), key))

    def on_mesh(self, state: PyTree) -> PyTree:
        """``state`` placed as the round's blocks return it: every array on the round's
        mesh, replicated unless the client store shards it (so the first block compiles
        for the same input shardings as the later ones)."""
        mesh = self.round.mesh
        if mesh is None:
            return state
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        on_mesh = lambda x: (
            x
            if isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.mesh == mesh
            else jax.device_put(x, replicated)
        )
        return jax.tree.map(on_mesh, state)

    def _hyper(self, key: PRNGKey, cells: bool, hyper: Hyper | None) -> Hyper:
        """``hyper``, else this setup's own (with ``cells``: repeated along ``key``'s cell axis)."""
        if hyper is not None:
            return hyper
        if not cells:
            return self.hyper
        return jax.tree.map(lambda h: jnp.broadcast_to(h, (key.shape[0], *h.shape)), self.hyper)

    def run_block(
        self,
        state: RunState,
        round_ids: jax.Array,
        plans: Schedule | None,
        hyper: Hyper,
        train: DeviceSplit,
        key: PRNGKey,
    ) -> tuple[RunState, dict[str, jax.Array]]:
        """The rounds ``round_ids`` as one ``lax.scan`` (one row of ``plans`` each).

        The arrays are arguments, not the fields of ``self``, so that ``jit``
        traces them instead of baking the dataset into the program.
        """

        def one(state, inputs):
            round_idx, plan = inputs
            return self.round.step(state, round_idx, hyper, train, key, plan)

        return jax.lax.scan(one, state, (round_ids, plans))

    def evaluate(self, state: RunState, test: DeviceSplit, row_client: jax.Array):
        """The global model on every test row; with a personal model, each client's own too."""
        round_, algorithm = self.round, self.round.algorithm
        params = algorithm.global_params(state.server_state)
        ev = evaluate(round_.model, params, test, row_client, batch_size=self.eval_batch_size)
        if (personalized := algorithm.hook(Personalized)) is not None:

            def params_of(ids):
                states = round_.store.gather(state.client_states, ids)
                personal = functools.partial(personalized.params, state.server_state)
                return jax.vmap(personal)(states)

            ev["personal_correct"], ev["personal_loss_sum"] = evaluate_personal(
                round_.model,
                params_of,
                test,
                max_count=self.max_test_count,
                chunk=max(1, self.eval_batch_size // max(self.max_test_count, 1)),
            )
        return ev

    def programs(
        self,
        key: PRNGKey,
        *,
        cells: bool = False,
        hyper: Hyper | None = None,
        cell_batch: int | None = None,
        donate: bool = True,
    ) -> tuple[Callable, Callable]:
        """Jitted ``block(state, round_ids, plans)`` and ``evaluate(state)``.

        With ``cells`` every argument but the round ids carries a leading axis
        of independent runs (``key`` and ``hyper`` too: each cell has its own
        hyperparameters, see ``init``) and both map over it: ``cell_batch``
        cells at a time as one ``vmap``, the batches one after another
        (``lax.map``); None: every cell in one ``vmap``. The jitted functions
        are made once per setup and mode, so calls with other keys or
        hyperparameters of the same shapes (a sweep's chunks of cells) reuse
        one compilation.

        ``donate``: ``block`` takes its state's buffers for the new state (the
        client-state table is updated in place, never copied), so a state passed
        to it must not be used again; False keeps it (a benchmark repeating a block).
        """
        mode = (cells, cell_batch, donate)
        if mode not in self._jitted:
            block, evaluate_ = self.run_block, self.evaluate
            if cells:
                block = self._over_cells(block, (0, None, 0, 0, None, 0), cell_batch)
                evaluate_ = self._over_cells(evaluate_, (0, None, None), cell_batch)
            self._jitted[mode] = (
                jax.jit(block, donate_argnums=0 if donate else ()),
                jax.jit(evaluate_),
            )
        block, evaluate_ = self._jitted[mode]
        hyper = self._hyper(key, cells, hyper)
        return (
            lambda state, ids, plans: block(state, ids, plans, hyper, self.train, key),
            lambda state: evaluate_(state, self.test, self.test_row_client),
        )

    @functools.cached_property
    def _jitted(self) -> dict[tuple[bool, int | None, bool], tuple[Callable, Callable]]:
        """``programs``' jitted functions by mode ``(cells, cell_batch, donate)``."""
        return {}

    @staticmethod
    def _over_cells(fn: Callable, in_axes: tuple[int | None, ...], batch: int | None) -> Callable:
        """``fn`` over the leading cell axis of the arguments whose ``in_axes`` is 0:
        one ``vmap``, or ``lax.map`` over batches of ``batch`` cells (``batch`` 1: no
        ``vmap`` at all, so each cell computes bitwise what ``fn`` alone computes;
        a ``vmap`` of one may pick other matrix-product kernels)."""
        if batch is None:
            return jax.vmap(fn, in_axes=in_axes)

        @functools.wraps(fn)
        def over_cells(*args):
            def one(cell_args):
                given = iter(cell_args)
                return fn(*(next(given) if axis == 0 else a for a, axis in zip(args, in_axes)))

            mapped = tuple(a for a, axis in zip(args, in_axes) if axis == 0)
            return jax.lax.map(one, mapped, batch_size=None if batch == 1 else batch)

        return over_cells


def _check(
    data: FederatedData,
    sampler: Sampler,
    rounds: int,
    eval_every: int,
    weighting: str,
    nonfinite: str,
) -> None:
    """Refuses the arguments no run trains (ValueError)."""
    if sampler.num_clients != data.num_clients:
        raise ValueError(
            f"sampler draws from {sampler.num_clients} clients but the data has {data.num_clients}"
        )
    if rounds < 1 or eval_every < 1:
        raise ValueError(f"rounds and eval_every must be >= 1, got {rounds} and {eval_every}")
    if weighting not in ("examples", "uniform"):
        raise ValueError(f"weighting must be 'examples' or 'uniform', got {weighting!r}")
    if data.test is None:
        raise ValueError("run needs a test split to evaluate; build the data with one")
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite must be 'stop' or 'drop', got {nonfinite!r}")


def _trained_model(
    plain: Model, run: Model, chunk: int | None, conv: str, precision: str
) -> tuple[Model, str | None]:
    """The model local training runs, and how it convolves: ``plain`` with the convolutions
    ``conv_choice.conv_model`` picks for ``chunk`` (None: not yet planned), at ``precision``;
    ``run`` (``plain`` at ``precision``) itself when that is ``plain``'s own."""
    trained, chosen = conv_choice.conv_model(plain, chunk, conv)
    return (run if trained is plain else run_model(trained, precision)), chosen


def _ring_bytes(
    model: Model, algorithm: FederatedAlgorithm, hyper: Hyper, num_clients: int, depth: int
) -> int:
    """Bytes of ``depth`` recent broadcasts kept for slots that train from older models."""
    if not depth:
        return 0
    params = jax.eval_shape(model.init, jax.random.key(0))
    ring = jax.eval_shape(
        algorithm.broadcast,
        jax.eval_shape(lambda p: algorithm.server_init(p, hyper, num_clients), params),
    )
    return depth * client_store.tree_bytes(ring)


def _ragged(spec, data: FederatedData) -> bool:
    """Whether the clients' full tasks take different numbers of steps (accelerators then
    run the cohort in several chunks sorted by work: ``cohort.auto_chunk``); not asked on
    CPU, whose chunk does not depend on it."""
    if step_cost.planning_backend() == "cpu":
        return False
    return len(np.unique(steps_needed(spec, data.train.count))) > 1
