"""The lines ``fedjax-het run`` prints after a run: what its system cost, and what its config
changed before it started (``notes``)."""

from __future__ import annotations

from fedjax_het.engine.client_store import format_bytes


def system_lines(summary: dict, num_clients: int, step: str = "round") -> list[str]:
    """What a run with a system cost: virtual time, outcomes, bytes, participation, and the
    round, virtual time and bytes at which each target accuracy was first reached."""
    if "virtual_s" not in summary:
        return []
    s = summary
    outcomes = ", ".join(f"{name} {count}" for name, count in s.get("outcomes", {}).items())
    lines = [
        f"system: {s['virtual_s'] / 3600:.3g} virtual hours ({s['virtual_s']:.1f} s); "
        + (f"outcomes {outcomes}; " if outcomes else "")
        + f"{format_bytes(s['bytes_down'])} down, {format_bytes(s['bytes_up'])} up"
    ]
    if "participation_gini" in s:
        lines.append(
            f"participation: Gini {s['participation_gini']:.3f}, "
            f"{s['clients_never_participated']} of {num_clients} clients never trained"
        )
    reached = []
    for target, hit in s.get("to_accuracy", {}).items():
        if hit is None:
            reached.append(f"{target} not reached")
        elif "virtual_s" in hit:
            moved = hit.get("bytes_down", 0.0) + hit.get("bytes_up", 0.0)
            reached.append(f"{target} at {step} {hit['round']}, {hit['virtual_s'] / 3600:.3g} "
                           f"virtual h, {format_bytes(moved)}")  # fmt: skip
    if reached:
        lines.append("to accuracy: " + "; ".join(reached))
    return lines
