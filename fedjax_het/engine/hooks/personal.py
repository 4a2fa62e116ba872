"""The personalisation hook: each client's own model for personalised evaluation (Ditto,
FedPer/FedRep, IFCA, APFL)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fedjax_het.typing import ClientState, Params, ServerState


@dataclasses.dataclass(frozen=True)
class Personalized:
    """``params(server_state, client_state) -> params`` client k's own model; the evaluation
    (``training.programs``) reports each client's accuracy with it beside the global
    model's."""

    params: Callable[[ServerState, ClientState], Params]
