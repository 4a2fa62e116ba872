"""Memory-aware chunking: the estimate tracks the model, the plan fits the budget or refuses.

The per-client figure from XLA's compiled memory analysis is checked against
two independent references: a floor it must exceed (a client must at least
hold its gathered batches and its update, sizes from shapes alone) and the
analytic estimate, which must lie between 1x and 2x of it (conservative, but
not by more than twice). Measured ratios, analytic / XLA on XLA:CPU: W1
(MLP 784-200-200-62, batch 20, 10 steps) 1.61 with FedAvg and 1.47 with
SCAFFOLD; FEMNIST CNN 1.49 (FedAvg), Ditto's MLP 1.15.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg, scaffold
from fedjax_het.data import LocalWork
from fedjax_het.engine import cohort, flops, memory, memory_estimate, step_cost
from fedjax_het.engine import round as round_module
from fedjax_het.engine.client_store import tree_bytes
from fedjax_het.engine.local import LocalSpec

N, ROWS = 100, 2000


def make_spec(model, algorithm, batch_size: int = 20, steps: int = 10) -> LocalSpec:
    """``steps`` local steps of ``batch_size`` (W1: 10 steps of 20, one epoch of 200 examples)."""
    work = LocalWork(batch_size=batch_size, steps=steps)
    return LocalSpec(model, algorithm, work, steps, max_count=200)


def plan(spec: LocalSpec, example=(784,), **kwargs) -> memory.ChunkPlan:
    train = memory.abstract_split(rows=ROWS, example=example, num_clients=N)
    kwargs = {"num_clients": N, "cohort": 100, "free_bytes": 10**12, **kwargs}
    return memory.plan_chunk(spec, spec.algorithm.hyper(), train, **kwargs)


FEDAVG = fedavg()
W1 = make_spec(models.mlp((784,), 62), FEDAVG)  # the throughput workload W1
SMALL = make_spec(models.mlp((784,), 62, hidden=(32,)), FEDAVG)


def test_xla_estimate_grows_with_the_model_and_the_batch():
    small = plan(SMALL, source="xla")
    wide = plan(W1, source="xla")
    bigger_batch = plan(make_spec(SMALL.model, FEDAVG, batch_size=40), source="xla")
    assert small.source == wide.source == "xla"
    assert 0 < small.per_client_bytes < wide.per_client_bytes
    assert small.per_client_bytes < bigger_batch.per_client_bytes
    assert small.fixed_bytes < wide.fixed_bytes  # the broadcast and the server's params


@pytest.mark.parametrize("algorithm", [FEDAVG, scaffold()], ids=["fedavg", "scaffold"])
def test_xla_slope_is_above_its_floor_and_the_analytic_estimate_within_2x(algorithm):
    spec = make_spec(W1.model, algorithm)
    xla, analytic = plan(spec, source="xla"), plan(spec, source="analytic")
    params = tree_bytes(jax.eval_shape(spec.model.init, jax.random.key(0)))
    batches = spec.max_steps * spec.work.batch_size * (784 * 4 + 4)  # float32 rows, int32 labels
    assert xla.per_client_bytes > batches + params  # its batches and its update
    assert 1.0 <= analytic.per_client_bytes / xla.per_client_bytes <= 2.0
    assert xla.slot_bytes == analytic.slot_bytes  # exact, from shapes
    assert xla.fixed_bytes == pytest.approx(analytic.fixed_bytes, rel=0.01)


def test_the_estimate_is_cached_by_the_static_round():
    plan(SMALL, source="xla")
    hits = memory_estimate.estimate.cache_info().hits
    again = plan(SMALL, source="xla", cohort=7, runs=3)
    assert memory_estimate.estimate.cache_info().hits == hits + 1
    assert again.per_client_bytes == plan(SMALL, source="xla").per_client_bytes


def test_a_round_that_cannot_fit_is_refused_in_one_line_before_any_cohort_runs(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("run_cohort must not be reached")

    monkeypatch.setattr(cohort, "run_cohort", never)
    monkeypatch.setattr(round_module, "run_cohort", never)
    with pytest.raises(ValueError, match="does not fit the device") as refused:
        plan(SMALL, source="xla", free_bytes=10**6)
    message = str(refused.value)
    assert "\n" not in message
    assert "chunk 1 of 100" in message and "1.0 MB free" in message and "cohort" in message


def test_the_chunk_shrinks_with_free_memory_and_never_exceeds_the_cohort():
    reference = plan(SMALL, source="analytic", cohort=50)
    chunks = []
    for fits in (80, 50, 30, 17, 5, 1):
        free = int(reference.need(fits) / memory.SAFETY) + 1
        chosen = plan(SMALL, source="analytic", cohort=50, cap=1000, free_bytes=free)
        assert chosen.need(chosen.chunk) <= memory.SAFETY * free
        # the whole cohort when it fits, else the largest power of two that fits
        assert chosen.chunk == (50 if fits >= 50 else 1 << (fits.bit_length() - 1))
        chunks.append(chosen.chunk)
    assert chunks == [50, 50, 16, 16, 4, 1]


def test_the_backend_preference_caps_the_chunk():
    cpu = plan(SMALL, source="analytic", cohort=300)
    assert cpu.chunk == cohort.auto_chunk(300, backend=jax.default_backend())
    assert plan(SMALL, source="analytic", cohort=300, cap=128).chunk == 128  # 3 chunks, padded
    assert plan(SMALL, source="analytic", cohort=300, cap=100).chunk == 64  # a power of two


def test_on_cpu_a_dense_model_runs_a_vmap_and_a_convolutional_one_client_at_a_time():
    cnn = make_spec(models.femnist_cnn((28, 28, 1), 62), FEDAVG)
    dense = plan(SMALL, source="analytic", cohort=300, free_bytes=10**12)
    conv = plan(cnn, example=(28, 28, 1), source="analytic", cohort=300, free_bytes=10**12)
    assert step_cost.convolutional(cnn.model, jax.ShapeDtypeStruct((5, 28, 28, 1), "float32"))
    assert not step_cost.convolutional(SMALL.model, jax.ShapeDtypeStruct((5, 784), "float32"))
    if jax.default_backend() == "cpu":
        assert (dense.chunk, conv.chunk) == (cohort.CPU_CHUNK, 1)
    assert cohort.auto_chunk(10, backend="cpu") == 10  # under two chunks: one, not 8 + 2 padded
    assert cohort.auto_chunk(300, backend="gpu", convolutional=True) == 300  # memory decides


def test_on_accelerators_varying_work_runs_in_sorted_chunks_of_enough_flops():
    # the whole cohort when every client's work is the same
    assert cohort.auto_chunk(1000, backend="gpu") == 1000
    # W1's MLP (2e7 FLOPs a step): 256 clients reach CHUNK_STEP_FLOPS; 10,000 clients in ~8
    assert cohort.auto_chunk(1000, backend="gpu", step_flops=2e7) == 256
    assert cohort.auto_chunk(10_000, backend="gpu", step_flops=2e7) == 2048
    # W2's CNN (3e9 FLOPs a step): about WORK_CHUNKS chunks of 16
    assert cohort.auto_chunk(100, backend="gpu", step_flops=3e9) == 16
    assert cohort.auto_chunk(100, backend="gpu", step_flops=1.0) == 100  # never above the cohort
    # the step's FLOPs: forward x 3 x batch; the MLP's forward is 2 x its weights, plus biases
    mlp = make_spec(models.mlp((784,), 62, hidden=(200, 200)), FEDAVG)
    split = memory.abstract_split(rows=64, example=(784,), num_clients=4)
    weights = 784 * 200 + 200 * 200 + 200 * 62
    cost = step_cost.step_cost(mlp, split)
    assert cost.source == "xla"  # XLA:CPU's lowered programs report their flops
    assert 2 * weights <= cost.flops / (3 * mlp.work.batch_size) < 2.1 * weights


def test_the_plan_splits_a_varying_cohort_only_on_an_accelerator(monkeypatch):
    split = {"source": "analytic", "cohort": 100_000, "work_varies": True}
    cost = step_cost.step_cost(SMALL, memory.abstract_split(rows=ROWS, example=(784,), num_clients=N))
    assert plan(SMALL, **split).chunk == cohort.auto_chunk(100_000, backend="cpu")
    assert plan(SMALL, **split).step is None  # not asked on CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert plan(SMALL, source="analytic", cohort=100_000).chunk == 100_000
    chosen = plan(SMALL, **split)
    assert chosen.chunk == cohort.auto_chunk(100_000, backend="gpu", step_flops=cost.flops)
    assert chosen.chunk == 16384  # 100,000 / WORK_CHUNKS, as a power of two
    assert "work varies" in chosen.describe() and "XLA's cost analysis" in chosen.describe()


@pytest.mark.parametrize("nothing", [None, {}, [], [{}], {"flops": 0.0}])
def test_without_xla_costs_the_step_is_counted_from_shapes_never_free(monkeypatch, nothing):
    # A backend whose lowered programs report no flops (as one H200 did): the plan must
    # still split a varying cohort into work-sorted chunks, from the model's shapes.
    monkeypatch.setattr(step_cost, "planning_backend", lambda: "gpu")
    monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: nothing)
    mlp = make_spec(models.mlp((784,), 62, hidden=(200, 200)), FEDAVG, batch_size=16)
    split = memory.abstract_split(rows=64, example=(784,), num_clients=4)
    cost = step_cost.step_cost(mlp, split)
    # the MLP's products, from its layer sizes: 2 FLOPs a multiply-add, x 3 for the backward
    weights = 784 * 200 + 200 * 200 + 200 * 62
    assert cost == step_cost.StepCost(3.0 * 2 * weights * 16, "shapes")
    chosen = plan(mlp, source="analytic", cohort=1000, work_varies=True)
    # 1,000 clients of W1 (2.0e7 FLOPs a step): 4 chunks of 256, sorted by work
    assert chosen.chunk == 256
    assert "counted from the model's shapes: XLA's cost analysis gave no flops" in chosen.describe()
    assert plan(mlp, source="analytic", cohort=1000).chunk == 1000  # equal work: one chunk


def test_the_shape_count_of_a_cnn_matches_xla_on_its_products():
    # The FEMNIST CNN's convolutions and dense layers from their shapes, derived by hand:
    # conv 5x5x1x32 at 28x28 and 5x5x32x64 at 14x14 ("same" padding), dense 3136x2048, 2048x62.
    cnn = models.femnist_cnn((28, 28, 1), 62)
    products = 28 * 28 * 25 * 32 + 14 * 14 * 25 * 32 * 64 + 3136 * 2048 + 2048 * 62
    assert flops.forward_flops(cnn, jax.ShapeDtypeStruct((1, 28, 28, 1), "float32")) == 2 * products


def test_an_explicit_chunk_wins_and_is_still_checked():
    assert plan(SMALL, source="analytic", cohort=10, chunk=4).chunk == 4
    assert plan(SMALL, source="analytic", cohort=10, chunk=6).chunk == 4  # cohort.effective_chunk
    assert plan(SMALL, source="analytic", cohort=10, chunk=64).chunk == 10
    one = plan(SMALL, source="analytic", cohort=10, chunk=1)
    free = int(one.need(2) / memory.SAFETY)  # room for 2 clients a chunk, not 4
    assert plan(SMALL, source="analytic", cohort=10, free_bytes=free, cap=10).chunk == 2
    with pytest.raises(ValueError, match="chunk 4 of 10"):
        plan(SMALL, source="analytic", cohort=10, chunk=4, free_bytes=free)


def test_runs_multiply_everything_but_the_data():
    one = plan(W1, source="analytic", chunk=8)
    four = plan(W1, source="analytic", chunk=8, runs=4)
    assert four.data_bytes == one.data_bytes > 0
    assert four.need(8) - four.data_bytes == 4 * (one.need(8) - one.data_bytes)
    free = int(one.need(100) / memory.SAFETY)
    assert plan(W1, source="analytic", cap=100, free_bytes=free).chunk == 100
    assert plan(W1, source="analytic", cap=100, free_bytes=free, runs=4).chunk < 100


def test_resident_bytes_count_once():
    base = plan(W1, source="analytic")
    held = plan(W1, source="analytic", runs=3, resident=12345)
    assert held.data_bytes == base.data_bytes + 12345


def test_auto_uses_the_analytic_sum_on_cpu():
    assert plan(SMALL).source == ("analytic" if jax.default_backend() == "cpu" else "xla")


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"source": "gpu"}, "source must be one of auto, xla, analytic, got 'gpu'"),
        ({"chunk": 0}, "chunk 0"),
        ({"runs": 0}, "runs 0"),
        ({"cohort": 0}, "cohort 0"),
        ({"cap": -1}, "cap -1"),
        ({"safety": 1.5}, "safety 1.5"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, problem):
    with pytest.raises(ValueError, match=problem) as refused:
        plan(SMALL, **kwargs)
    assert "\n" not in str(refused.value)


def test_describe_is_one_line_with_the_figures():
    p = dataclasses.replace(plan(SMALL, source="analytic", runs=2, chunk=1), free_bytes=2 * 10**9)
    line = p.describe()
    assert "\n" not in line and line.startswith("chunk 1 of 100 (analytic: ")
    assert "x 2 runs" in line and "of 2.0 GB free" in line
