"""LocalWork: steps or epochs, and clear errors."""

import jax.numpy as jnp
import pytest

from fedjax_het.data.batching import LocalWork


def test_steps_alone_or_epochs_alone():
    assert LocalWork(batch_size=4, steps=3).static_steps(max_count=100) == 3
    assert LocalWork(batch_size=4).epochs == 1.0  # neither: one epoch
    work = LocalWork(batch_size=4, epochs=2.5)
    assert work.static_steps(max_count=10) == 7  # ceil(2.5 * 10 / 4)
    assert int(work.examples_to_process(jnp.int32(10))) == 25


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 1.0, "steps": 3}, "epochs or steps, not both"),
        ({"epochs": 0.0}, "epochs must be > 0"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
    ],
)
def test_bad_work_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalWork(batch_size=4, **kwargs)
