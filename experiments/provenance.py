"""Where a result came from, and the guard that keeps ``results/`` to results of clean commits.

A result written under ``results/`` records its ``provenance``: the commit, whether the tree
was clean, whether the writer was told to write from a dirty one (``--allow-dirty``) and the
command (the environment travels beside it, ``fedjax_het.results.environment``). The scripts
call ``guard`` before they run anything: from a tree with changes to tracked or untracked
files outside ``results/`` and ``bench_results/`` they refuse, in one line, to write there
unless ``--allow-dirty`` is given, which is then recorded.

``python experiments/provenance.py`` prints the audit of what is committed under
``results/``: every result file with the revision and the dirty flag it recorded
(``results/PROVENANCE.md`` is its output).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
OUTPUTS = ("experiments/results/", "experiments/bench_results/")  # data, not code


def add_flag(parser: argparse.ArgumentParser) -> None:
    """``--allow-dirty``: write under ``results/`` from a tree with changes (recorded)."""
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write under experiments/results/ from a tree with uncommitted changes (recorded)",
    )


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def changes() -> list[str] | None:
    """The paths ``git status`` reports changed or untracked, outside the result folders
    (None when git cannot say)."""
    status = _git("status", "--porcelain", "--untracked-files=all")
    if status is None:
        return None
    paths = [line[3:] for line in status.splitlines() if line.strip()]
    return [path for path in paths if not path.startswith(OUTPUTS)]


def stamp(allow_dirty: bool) -> dict[str, Any]:
    """The provenance of a result written now."""
    commit = _git("rev-parse", "HEAD")
    changed = changes()
    return {
        "commit": commit.strip() if commit else "unknown",
        "clean": changed == [],
        "changed": changed if changed is None else changed[:20],
        "allow_dirty": bool(allow_dirty),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def inside_results(out: Path) -> bool:
    """Whether ``out`` lies in ``results/``."""
    return Path(out).resolve().is_relative_to(RESULTS)


def guard(out: Path, allow_dirty: bool) -> None:
    """Exits with a one-line error when ``out`` lies in ``results/``, the tree has changes and
    ``allow_dirty`` is false."""
    if not inside_results(out) or allow_dirty:
        return
    changed = changes()
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise SystemExit(
            f"error: refusing to write {out} from a tree with uncommitted changes "
            f"({', '.join(changed[:3])}{more}): commit them, write elsewhere with --out, "
            "or pass --allow-dirty (recorded)"
        )


def _recorded(value: Any) -> list[tuple[str, Any, Any]]:
    """``(revision, dirty, allow_dirty)`` of every environment or provenance in ``value``."""
    found = []
    if isinstance(value, dict):
        if isinstance(value.get("provenance"), dict):
            found += _recorded(value["provenance"])
        elif "commit" in value and "clean" in value:
            found.append((value["commit"][:7], not value["clean"], value.get("allow_dirty")))
        elif "git_revision" in value and "git_dirty" in value:
            found.append((value["git_revision"][:7], value["git_dirty"], None))
        else:
            for item in value.values():
                found += _recorded(item)
    elif isinstance(value, list):
        for item in value:
            found += _recorded(item)
    return found


def audit() -> str:
    """A Markdown table of every ``.json``/``.jsonl`` under ``results/``: the revisions it
    records and whether any of them was measured from a dirty tree."""
    lines = ["| result | revisions recorded | measured from a dirty tree |", "|---|---|---|"]
    for path in sorted(RESULTS.rglob("*.json*")):
        text = path.read_text()
        rows = (
            [json.loads(text)]
            if path.suffix == ".json"
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
        found = set(_recorded(rows))
        revisions = ", ".join(sorted({r for r, _, _ in found})) or "none recorded"
        dirty = {d for _, d, _ in found}
        verdict = "yes" if True in dirty else ("no" if dirty == {False} else "unknown")
        lines.append(f"| `{path.relative_to(RESULTS)}` | {revisions} | {verdict} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(audit())
