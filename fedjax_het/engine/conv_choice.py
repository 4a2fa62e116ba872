"""How a round's convolutions run: the plan's choice of formulation (docs/design.md §3).

A model that offers a choice (``Model.with_conv``; the LEAF CNN) convolves in local training
as XLA does or as im2col patches and a matmul (``fedjax_het.convolution``); the plan picks
(``programs.Setup.build``, before and after ``memory.plan_memory`` sizes the chunk).
"""

from __future__ import annotations

import jax

from fedjax_het.models import Model

CONV_BY_BACKEND: dict[str, str] = {}  # a vmapped chunk's convolutions by backend, where measured
# faster than XLA's; else "xla". Not on CPU: at W2/10 patches at chunk 10 took 1.11x the loop,
# XLA's at chunk 1 0.97x (experiments/README.md, "W2: a cohort's convolutions as a batched
# matmul"); accelerators not yet measured.


def conv_impl_for(backend: str, model: Model, chunk: int | None, conv: str = "auto") -> str | None:
    """How a round's convolutions run (``fedjax_het.convolution``): None for a model that
    offers no choice (``Model.with_conv``); ``conv`` when it names a formulation; "auto": a
    vmapped chunk's (``chunk`` > 1, or None: not yet planned) as ``CONV_BY_BACKEND`` says,
    a chunk of one client XLA's (a single convolution is XLA's own fast case)."""
    if model.with_conv is None:
        return None
    if conv != "auto":
        return conv
    return "xla" if chunk == 1 else CONV_BY_BACKEND.get(backend, "xla")


def conv_model(
    model: Model, chunk: int | None, conv: str = "auto", backend: str | None = None
) -> tuple[Model, str | None]:
    """``model`` with its convolutions as ``conv_impl_for`` chooses, and the choice."""
    impl = conv_impl_for(backend or jax.default_backend(), model, chunk, conv)
    return (model if impl in (None, model.conv) else model.with_conv(impl)), impl
