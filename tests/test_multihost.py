"""Two processes on localhost run as one (``jax.distributed``), matching a single process.

Each process has two CPU devices; together they form the same 4-device mesh
this test process has (``tests/conftest.py``). They run ``fedjax-het run``
with a ``[distributed]`` table, and the rounds must match a single-process
run on 4 devices to the tolerance of ``tests/test_multidevice.py`` (the
cross-host sum may add in another order). Only process 0 writes results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from fedjax_het.front import cli, config
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

TINY = [
    'data.name="synthetic"', "data.num_clients=10", "sampler.clients_per_round=7",
    "model.name=logistic_regression", "rounds=4", "eval_every=2", "engine.chunk=2",
    'algorithm.name="ditto"',
]
RTOL, ATOL = 1e-5, 1e-6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(process_id: int, port: int, out) -> subprocess.Popen:
    sets = [*TINY, "distributed.enabled=true", f'distributed.coordinator_address="localhost:{port}"',
            "distributed.num_processes=2", f"distributed.process_id={process_id}"]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    args = [arg for s in sets for arg in ("--set", s)]
    return subprocess.Popen(
        [sys.executable, "-m", "fedjax_het.front.cli", "run", *args, "--out", str(out), "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one_and_only_process_0_writes(tmp_path):
    port = free_port()
    processes = [launch(i, port, tmp_path / f"out{i}") for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(outputs)
    assert "final test accuracy" in outputs[0] and "final test accuracy" not in outputs[1]
    assert not (tmp_path / "out1").exists()
    summary = json.loads((tmp_path / "out0" / "summary.json").read_text())
    assert summary["devices"] == 4

    e = config.build(config.load(None, TINY))
    kwargs = {**e.run_kwargs(), "devices": 4}
    alone = simulate.run(
        e.data,
        *run_options(
            model=e.model,
            algorithm=e.algorithm,
            sampler=e.sampler,
            **kwargs,
            progress=False,
        ),
    )
    together = metrics(tmp_path / "out0" / "metrics.jsonl")
    assert [m["round"] for m in together] == [m["round"] for m in alone.metrics]
    for key in ("test_loss", "test_accuracy", "train_loss", "personal_accuracy_mean"):
        got = np.asarray([m[key] for m in together][1:], np.float64)
        want = np.asarray([m[key] for m in alone.metrics][1:], np.float64)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.parametrize("sets, message", [
    (["distributed.enabled=true", "distributed.num_processes=2", "distributed.process_id=2"],
     "process_id must be between 0 and num_processes - 1"),
    (["distributed.num_processes=2"], "set enabled = true"),
    (["distributed.hosts=2"], "distributed.hosts"),
])
def test_distributed_table_is_checked(sets, message):
    with pytest.raises(config.ConfigError, match=message):
        config.cluster(config.load(None, sets))
    assert cli.main(["config", *(a for s in sets for a in ("--set", s))]) == 2
