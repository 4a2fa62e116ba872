"""The package's layers: every import goes to its own layer or one below (docs/design.md)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _diagram():
    spec = importlib.util.spec_from_file_location("make_diagram", ROOT / "docs" / "make_diagram.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_diagram", module)
    spec.loader.exec_module(module)
    return module


def test_every_module_sits_in_a_layer():
    diagram = _diagram()
    unplaced = [name for name in diagram.modules() if diagram.group_of(name) == diagram.UNPLACED[0]]
    assert not unplaced, f"modules in no layer of docs/make_diagram.py's LAYERS: {unplaced}"


def test_imports_only_go_down_the_layers():
    diagram = _diagram()
    allowed = {layer: {layer, *below} for layer, _, _, below in diagram.LAYERS}
    wrong = [
        f"{name} ({diagram.group_of(name)}) imports {target} ({diagram.group_of(target)})"
        for name, edges in diagram.imports(diagram.modules()).items()
        for target in edges
        if diagram.group_of(target) not in allowed[diagram.group_of(name)]
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_the_layer_rule_can_fail():
    diagram = _diagram()
    allowed = {layer: set(below) for layer, _, _, below in diagram.LAYERS}
    assert "training" not in allowed["engine"] and "engine" not in allowed["data"]
