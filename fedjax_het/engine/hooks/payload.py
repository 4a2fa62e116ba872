"""The payload hook: the bytes a client receives and sends in a round, when they are not the
params at float32 both ways (compressed encodings: ``transforms.compression``; FetchSGD's
sketch; Mime's extra download)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fedjax_het.typing import Params


@dataclasses.dataclass(frozen=True)
class PayloadBytes:
    """``count(params) -> (down, up)``: bytes one client receives and sends in a round, for
    params of these shapes. Both schedules (planned and in-loop) price transfers with it
    (``training.costs.payload_bytes``)."""

    count: Callable[[Params], tuple[float, float]]
