"""The memory plan against the compiled chunk program: a forced small budget shrinks the chunk.

``memory.plan_chunk`` with source "xla" takes its straight line (the programs of
2 and 4 clients) as a first guess only, then compiles the chosen chunk's own
program and halves the chunk while ``Compiled.memory_analysis()`` says it does
not fit. Here the line is made blind (one byte a client, as the line that chose
chunk 1,000 at W2/1,000 on an H200, where XLA then asked for 73.55 GiB), the free
memory small, and the plan must shrink the chunk instead of failing.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data import LocalWork
from fedjax_het.engine import memory, memory_estimate
from fedjax_het.engine.client_store import tree_bytes
from fedjax_het.engine.local import LocalSpec

N, ROWS, COHORT = 32, 512, 16
SPEC = LocalSpec(models.mlp((32,), 10, hidden=(16,)), fedavg(), LocalWork(batch_size=8), 2, 16)
TRAIN = memory.abstract_split(rows=ROWS, example=(32,), num_clients=N)


def plan(**kwargs) -> memory.ChunkPlan:
    kwargs = {"num_clients": N, "cohort": COHORT, "cap": COHORT, "source": "xla", **kwargs}
    return memory.plan_chunk(SPEC, SPEC.algorithm.hyper(), TRAIN, **kwargs)


def compiled_bytes(c: int) -> int:
    """The program of ``c`` clients as XLA measures it, read here from the analysis itself."""
    leaves, treedef = jax.tree.flatten(memory._abstract((SPEC.algorithm.hyper(), TRAIN)))
    return memory_estimate.chunk_program_bytes(SPEC, N, treedef, tuple(leaves), c)


@pytest.fixture
def blind_line(monkeypatch):
    """The straight-line estimate says a client costs one byte."""
    estimate = memory_estimate.estimate

    def blind(*args):
        return dataclasses.replace(estimate(*args), per_client=1)

    monkeypatch.setattr(memory_estimate, "estimate", blind)


def test_a_small_budget_shrinks_the_chunk_to_what_the_compiled_program_fits(blind_line):
    # Budget: between what chunks 4 and 8 need by XLA's own figure, so the plan that trusts
    # the line (chunk 16) would run out; the compiled check must halve 16 -> 8 -> 4.
    whole = plan(free_bytes=10**12)
    assert whole.chunk == COHORT and whole.halved == ()
    # per run: the program (the training split among its arguments, counted once in the
    # plan's data) and the server state beside it, then the cohort's slots
    server = memory_estimate.server_bytes(SPEC, SPEC.algorithm.hyper(), N)
    program = {c: compiled_bytes(c) - tree_bytes(TRAIN) + server for c in (4, 8)}
    need = {c: whole.data_bytes + program[c] + COHORT * whole.slot_bytes for c in program}
    budget = (need[4] + need[8]) / 2
    chosen = plan(free_bytes=int(budget / memory.SAFETY))
    assert chosen.chunk == 4
    assert [c for c, _ in chosen.halved] == [16, 8]
    assert all(b > memory.SAFETY * chosen.free_bytes for _, b in chosen.halved)
    assert chosen.needed <= memory.SAFETY * chosen.free_bytes
    line = chosen.describe()
    assert "chunk 4 of 16" in line and "compiled chunk program" in line and "halved" in line


def test_the_chunk_program_is_compiled_once_per_size(blind_line):
    plan(free_bytes=10**12)
    misses = memory_estimate.chunk_program_bytes.cache_info().misses
    plan(free_bytes=10**12, runs=2)
    assert memory_estimate.chunk_program_bytes.cache_info().misses == misses


def test_an_explicit_chunk_is_checked_against_its_compiled_program_not_halved(blind_line):
    budget = plan(chunk=4, free_bytes=10**12).needed
    with pytest.raises(ValueError, match="does not fit the device: chunk 16 of 16"):
        plan(chunk=16, free_bytes=int(budget / memory.SAFETY))


def test_without_a_memory_analysis_the_plan_is_conservative_and_says_so(monkeypatch):
    analytic = plan(source="analytic", free_bytes=10**12)
    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", lambda self: None)
    memory_estimate.estimate.cache_clear()
    memory_estimate.chunk_program_bytes.cache_clear()
    try:
        blind = plan(free_bytes=10**12)
    finally:
        memory_estimate.estimate.cache_clear()
        memory_estimate.chunk_program_bytes.cache_clear()
    assert blind.source == memory_estimate.NO_ANALYSIS
    assert blind.per_client_bytes == 2 * analytic.per_client_bytes
    assert blind.measured_bytes is None
    assert "no XLA memory analysis" in blind.describe()
