"""A round's float32 compute bound: its training FLOPs at the device's peak float32 rate.

The issue "Accelerator throughput II", item 1, holds W2's homogeneous round at 100 clients
to at most BOUND_FACTOR = 2 times this bound (about 40 ms on an H200). Training FLOPs are
TRAIN_OVER_FORWARD = 3 times the forward pass's: the backward pass runs two products of a
forward one's size for each (the gradient of its input and of its kernel; Kaplan et al.
2020, "Scaling Laws for Neural Language Models", §2.1: 2N forward, 6N in all). The forward
pass's products are counted from its jaxpr (``fedjax_het.engine.flops.forward_flops``,
2 FLOPs a multiply-add, elementwise work left out), per example, times the examples the
round trains. The rate is the datasheet's FP32 figure (CUDA cores, not TF32 tensor cores:
the check's timed programs run at matmul precision "highest"): NVIDIA H100 Tensor Core GPU
datasheet (2023), 67 TFLOPS SXM, 51 PCIe, 60 NVL; NVIDIA H200 Tensor Core GPU datasheet
(2024), 67 TFLOPS SXM, 60 NVL. Other devices have no bound here (None).

>>> from fedjax_het import models
>>> round_flops(models.mlp((4,), 3, hidden=(5,)), (4,), 10)  # 3 x 2 x (4 x 5 + 5 x 3) x 10
2100.0
>>> peak_float32("gpu:NVIDIA H200"), peak_float32("cpu:cpu")
(67000000000000.0, None)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from fedjax_het import models
from fedjax_het.engine.flops import forward_flops

TRAIN_OVER_FORWARD = 3.0
BOUND_FACTOR = 2.0  # the target: the round at most this many times its bound
PEAK_FLOAT32 = (  # (name in the device kind, FLOP/s); the first match counts
    ("H100 PCIe", 51e12),
    ("H100 NVL", 60e12),
    ("H200 NVL", 60e12),
    ("H100", 67e12),
    ("H200", 67e12),
)


def round_flops(model: models.Model, example_shape: Sequence[int], examples: int) -> float:
    """Training FLOPs of a round over ``examples`` float32 examples shaped ``example_shape``."""
    one = jax.ShapeDtypeStruct((1, *example_shape), jnp.float32)
    return TRAIN_OVER_FORWARD * forward_flops(model, one) * examples


def peak_float32(device: str) -> float | None:
    """The peak float32 FLOP/s of the device named ``device`` (a device kind), or None."""
    return next((rate for name, rate in PEAK_FLOAT32 if name in device), None)


def bound_s(flops: float, device: str) -> float | None:
    """Seconds ``flops`` take at ``device``'s peak float32 rate; None without a rate."""
    rate = peak_float32(device)
    return None if rate is None else flops / rate
