"""The README's Python examples are the scripts in ``examples/`` and print what it shows.

Each ``python`` block of README.md's "The Python API" is followed by "`python
examples/NAME.py` runs it and prints:" and a plain block of what the script prints. The tests
check that every block is its file, character for character, and that every script of
``examples/`` is shown; then run each script as a user would (``python examples/NAME.py``: a
process of its own on one CPU device, in an empty working folder) and compare what it prints
with the README's block, numbers to the digit, and check it left that folder empty.

The line "A first run" quotes for ``make run`` (``fedjax-het run``, the default experiment) is
checked the same way, by running the default experiment at its full size (slow: 200 rounds).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_het.front import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLES = ROOT / "examples"
SHOWN = re.compile(
    r"^```python\n(?P<code>.*?)^```\n\n"
    r"`python examples/(?P<name>\w+)\.py` runs it and prints:\n\n"
    r"```\n(?P<output>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
PLAIN_BLOCK = re.compile(r"^```\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section(text: str, heading: str) -> str:
    """The text of ``## heading``, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def shown_examples(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (code, output)}`` of the Python API section's examples."""
    api = section(text, "The Python API")
    found = {m["name"]: (m["code"], m["output"]) for m in SHOWN.finditer(api)}
    assert len(found) == api.count("```python\n"), "a python block without its script and output"
    return found


def as_pattern(shown: str) -> re.Pattern:
    """A shown output line as a pattern of the printed line: ``...`` stands for any text and
    ``<time>`` for a run folder's time stamp; every other character, digits included, as is."""
    parts = (re.escape(p).replace(re.escape("<time>"), r"\S+") for p in shown.split("..."))
    return re.compile(".*?".join(parts))


def one_device_env() -> dict[str, str]:
    """This process's environment for a script, as a user's plain ``python`` runs it: one CPU
    device (conftest's four fake devices removed), no bytecode written into ``examples/``,
    warnings and accidental rank promotion errors, as in the suite. The compilation cache
    folder (``FEDJAX_HET_CACHE_DIR``) stays the session's."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    return {
        **os.environ,
        "XLA_FLAGS": " ".join(flags),
        "JAX_PLATFORMS": "cpu",
        "JAX_NUMPY_RANK_PROMOTION": "raise",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONWARNINGS": "error",
    }


EXAMPLE_NAMES = sorted(shown_examples(README))


def test_each_readme_example_is_its_script():
    shown = shown_examples(README)
    assert set(shown) == {path.stem for path in EXAMPLES.glob("*.py")}
    for name, (code, _) in shown.items():
        assert code == (EXAMPLES / f"{name}.py").read_text(encoding="utf-8"), name


def test_an_example_without_its_output_is_refused():
    text = "# A\n\n## The Python API\n\n```python\nprint(1)\n```\n\n## Next\n"
    with pytest.raises(AssertionError, match="without its script"):
        shown_examples(text)


def test_shown_lines_match_only_the_printed_numbers():
    pattern = as_pattern("accuracy 0.8122 (best 0.8194), mean ...; in ... s; runs/fm-<time>")
    assert pattern.fullmatch("accuracy 0.8122 (best 0.8194), mean 0.8; in 12.0 s; runs/fm-0102")
    assert not pattern.fullmatch("accuracy 0.8123 (best 0.8194), mean 0.8; in 12 s; runs/fm-0")
    assert not pattern.fullmatch("accuracy 0.8122 (best 0.8194), mean 0.8; in 12 s; out/fm-0")


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_prints_what_the_readme_shows(name, tmp_path):
    """2 to 17 s a script on the shared 2-core CPU (JAX's start and compilations)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        cwd=tmp_path,
        env=one_device_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == (shown_examples(README)[name][1], "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the default experiment at its full size: 200 rounds, 20 to 60 s
def test_the_first_runs_line_is_the_default_experiments(tmp_path, monkeypatch, capsys):
    blocks = PLAIN_BLOCK.findall(section(README, "A first run"))
    (shown,) = [line for b in blocks for line in b.splitlines() if "final test accuracy" in line]
    monkeypatch.chdir(tmp_path)  # as `make run` does, results go to ./runs/
    capsys.readouterr()
    # One device, as a user's process has (conftest gives this one four fake CPU devices).
    assert cli.main(["run", "--no-progress", "--set", "engine.devices=1"]) == 0
    printed = capsys.readouterr()
    lines = [line.strip() for line in (printed.out + printed.err).splitlines()]
    assert any(as_pattern(shown).fullmatch(line) for line in lines), (shown, lines)
