"""The package's layers: every import goes to its own layer or one below (docs/design.md)."""

import ast
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


def violations(diagram, graph) -> list[str]:
    """Every import of ``graph`` (``{module: {imported: eager}}``) against the layers."""
    allowed = {layer: {layer, *below} for layer, _, _, below in diagram.LAYERS}
    return sorted(
        f"{name} ({diagram.group_of(name)}) imports {target} ({diagram.group_of(target)})"
        for name, edges in graph.items()
        for target in edges
        if diagram.group_of(target) not in allowed[diagram.group_of(name)]
    )


def test_imports_only_go_down_the_layers():
    diagram = _diagram()
    wrong = violations(diagram, diagram.imports(diagram.modules()))
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_an_import_up_the_layers_is_found():
    diagram = _diagram()
    upward = {"fedjax_het.engine.round": {"fedjax_het.training.simulate": False}}
    assert violations(diagram, upward) == [
        "fedjax_het.engine.round (engine) imports fedjax_het.training.simulate (training)"
    ]
    assert violations(diagram, {"fedjax_het.training.simulate": {"fedjax_het.engine.round": True}}) == []


def _python_files():
    for folder in ("fedjax_het", "algorithms", "sampling"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_module_over_400_lines_without_a_reason_and_none_over_500():
    long = []
    for path in _python_files():
        text = path.read_text()
        n = len(text.splitlines())
        explained = "Over 400 lines on purpose" in (ast.get_docstring(ast.parse(text)) or "")
        if n > 500 or (n > 400 and not explained):
            long.append(f"{path.relative_to(ROOT)}: {n}")
    assert not long, (
        f"modules over 400 lines without a reason at their top, or over 500 (split them by "
        f"what they do): {long}"
    )


def test_no_function_over_80_lines():
    long = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function and (n := node.end_lineno - node.lineno + 1) > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, f"functions over 80 lines (extract named steps): {long}"
