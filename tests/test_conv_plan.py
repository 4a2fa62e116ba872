"""The plan chooses how a CNN's convolutions run (``conv_choice.conv_impl_for``), states it in the
chunk plan's line and ``summary.json``, and leaves a model without convolutions alone."""

import json

import jax
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.data.femnist_like import femnist_like
from fedjax_het.engine import conv_choice
from fedjax_het.front import config
from fedjax_het.schema import ConfigError

CNN = models.femnist_cnn((28, 28, 1), 62)
MLP = models.mlp((784,), 62, hidden=(8,))


def test_the_choice_by_backend_chunk_and_request(monkeypatch):
    assert conv_choice.conv_impl_for("cpu", MLP, 10) is None  # nothing to choose
    assert conv_choice.conv_impl_for("cpu", CNN, 10) == "xla"  # patches measured slower on CPU
    assert conv_choice.conv_impl_for("cpu", CNN, 10, "xla") == "xla"  # asked for
    assert conv_choice.conv_impl_for("cpu", CNN, 1, "patches") == "patches"
    monkeypatch.setitem(conv_choice.CONV_BY_BACKEND, "gpu", "patches")  # where patches win
    assert conv_choice.conv_impl_for("gpu", CNN, 100) == "patches"  # a vmapped chunk
    assert conv_choice.conv_impl_for("gpu", CNN, None) == "patches"  # not yet planned: vmapped
    assert conv_choice.conv_impl_for("gpu", CNN, 1) == "xla"  # one client: no vmap
    assert conv_choice.conv_impl_for("tpu", CNN, 100) == "xla"  # not measured
    model, chosen = conv_choice.conv_model(CNN, 10, backend="gpu")
    assert (model.conv, chosen) == ("patches", "patches")
    assert conv_choice.conv_model(MLP, 10, backend="cpu") == (MLP, None)
    assert conv_choice.conv_model(CNN, 1, backend="cpu")[0] is CNN  # already XLA's: the same model


def overrides(model: str, *extra: str) -> list[str]:
    return [
        'data.name = "synthetic"' if model == "mlp" else 'data.name = "femnist_like"',
        "data.num_clients = 8", f'model.name = "{model}"', "sampler.clients_per_round = 4",
        "local.batch_size = 8", "local.steps = 2", "rounds = 2", "eval_every = 2",
        "engine.devices = 1",  # the fake CPU devices would give each one client: chunk 1
        *(["model.hidden = [8]"] if model == "mlp" else []), *extra,
    ]  # fmt: skip


def run(tmp_path, name, *extra, model="femnist_cnn"):
    from fedjax_het.training import simulate

    exp = config.build(config.load(None, overrides(model, *extra)))
    out = tmp_path / name
    history = simulate.run(
        exp.data,
        *exp.options(progress=False, out_dir=out, config=exp.config, targets=(),
        ),
    )  # fmt: skip
    return history, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU choice")
def test_a_cnn_run_on_cpu_trains_a_vmapped_chunk_as_patches_to_float_rounding(tmp_path):
    patches_history, patches = run(tmp_path, "patches", 'engine.conv = "patches"')
    xla_history, xla = run(tmp_path, "auto")
    assert (patches["chunk"], patches["conv"]) == (4, "patches")  # planned as a dense model
    assert patches["chunk_plan"].endswith("; convolutions as patches")
    assert (xla["chunk"], xla["conv"]) == (1, "xla")  # CPU's choice: one client at a time
    # the same training to float rounding
    np.testing.assert_allclose(patches["final_test_loss"], xla["final_test_loss"], rtol=1e-4)
    assert patches_history.summary["rounds"] == xla_history.summary["rounds"] == 2


def test_a_run_without_convolutions_records_no_choice(tmp_path):
    _, summary = run(tmp_path, "mlp", model="mlp")
    assert "conv" not in summary and "convolutions" not in summary["chunk_plan"]


def test_a_bad_engine_conv_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="engine.conv") as error:
        config.build(config.load(None, overrides("femnist_cnn", 'engine.conv = "fft"')))
    assert "\n" not in str(error.value)


def test_the_generated_data_fits_the_cnn():
    data = femnist_like(3, seed=0)
    params = CNN.init(jax.random.key(0))
    assert CNN.apply(params, data.train.x[:2], train=False, key=None).shape == (2, 62)
