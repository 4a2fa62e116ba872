"""experiments/provenance.py: the dirty-tree guard on ``results/``, the stamp, the audit.

The git state is replaced by a fixed list of changed paths (``provenance.changes``), so the
tests do not depend on this checkout's state.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
import provenance


def dirty(monkeypatch, paths):
    monkeypatch.setattr(provenance, "changes", lambda: list(paths))


def test_guard_refuses_a_dirty_tree_into_results_in_one_line(monkeypatch):
    dirty(monkeypatch, ["a.py", "b.py", "c.py", "d.py"])
    with pytest.raises(SystemExit) as raised:
        provenance.guard(provenance.RESULTS / "x", allow_dirty=False)
    message = str(raised.value)
    assert "\n" not in message and "--allow-dirty" in message and "a.py" in message
    assert "1 more" in message


def test_guard_lets_through_allow_dirty_outside_results_and_a_clean_tree(monkeypatch, tmp_path):
    dirty(monkeypatch, ["a.py"])
    provenance.guard(provenance.RESULTS / "x", allow_dirty=True)
    provenance.guard(tmp_path / "x", allow_dirty=False)
    dirty(monkeypatch, [])
    provenance.guard(provenance.RESULTS / "x", allow_dirty=False)


def test_stamp_records_clean_allow_dirty_and_the_command(monkeypatch):
    dirty(monkeypatch, ["a.py"])
    stamp = provenance.stamp(allow_dirty=True)
    assert stamp["clean"] is False and stamp["allow_dirty"] is True
    assert stamp["changed"] == ["a.py"] and stamp["command"]
    dirty(monkeypatch, [])
    assert provenance.stamp(allow_dirty=False)["clean"] is True


def test_the_flag_parses():
    parser = argparse.ArgumentParser()
    provenance.add_flag(parser)
    assert parser.parse_args(["--allow-dirty"]).allow_dirty
    assert not parser.parse_args([]).allow_dirty


def test_audit_reads_both_record_forms(monkeypatch, tmp_path):
    (tmp_path / "a").mkdir()
    old = {"environment": {"git_revision": "1234567abc", "git_dirty": True}}
    new = {
        "environment": {
            "git_revision": "89abcde",
            "git_dirty": False,
            "provenance": {"commit": "89abcdef", "clean": True, "allow_dirty": False},
        }
    }
    (tmp_path / "a" / "results.json").write_text(json.dumps(old))
    (tmp_path / "b.jsonl").write_text(json.dumps(new) + "\n" + json.dumps(new) + "\n")
    monkeypatch.setattr(provenance, "RESULTS", tmp_path)
    table = provenance.audit()
    assert "| `a/results.json` | 1234567 | yes |" in table
    assert "| `b.jsonl` | 89abcde | no |" in table


def test_every_committed_result_records_a_clean_commit():
    rows = provenance.audit().splitlines()[2:]
    assert len(rows) > 10  # the committed results are all read
    assert [row for row in rows if not row.endswith("| no |")] == []


def test_provenance_md_holds_the_current_audit():
    assert provenance.audit() in (provenance.RESULTS / "PROVENANCE.md").read_text()
