"""The README's shell examples run, shortened, in an empty folder, so that they cannot rot.

Every fenced block of ``README.md`` that holds a ``fedjax-het`` command (lines with
placeholders such as ``[CONFIG.toml]`` or ``RUN_DIR`` are the synopsis, not commands) runs in a
temporary folder, line by line as written, except that:

- ``fedjax-het run`` and ``sweep`` get ``--set rounds=2 --set eval_every=1 --no-progress`` and
  ``hetero describe`` fewer Monte-Carlo draws; commands run in this process through
  ``fedjax_het.front.cli.main`` and must exit with 0;
- the other shell lines (those that write the files a command reads) run in ``bash``;
- ``ssh HOST "CMD"`` runs ``CMD`` on this machine, in a process of its own, with the
  coordinator's address moved to a free port on localhost;
- ``srun`` lines are parsed and their config checked, not run (no SLURM here).

The ``# ...`` comment lines right under a command show its output: each must begin as one of
the shortened run's output lines does (up to its first number). Running the blocks takes
minutes, so those tests are marked slow (``make test-slow``); finding the blocks and parsing
their commands is not.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_het.front import cli, config

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
PLACEHOLDER = re.compile(r"\[|\b[A-Z][A-Z_]{2,}\b")
SHORT = ["--set", "rounds=2", "--set", "eval_every=1", "--no-progress"]
SHORT_DESCRIBE = ["--set", "rounds=2", "--mc-rounds", "50", "--mc-trips", "200"]
# A full-size run as a user's single-device process runs it (conftest gives this process four
# CPU devices, whose cross-device sum orders the cohort's additions differently).
ONE_DEVICE = ["--set", "engine.devices=1", "--no-progress"]


@dataclasses.dataclass
class Command:
    """A ``fedjax-het`` command, run in ``cwd`` (relative to the example's folder)."""

    argv: list[str]
    cwd: str = "."
    output: list[str] = dataclasses.field(default_factory=list)
    how: str = "here"  # "here": in this process; "ssh": a process of its own; "srun": checked


@dataclasses.dataclass(frozen=True)
class Block:
    section: str
    number: int  # the section's first, second... example
    text: str

    @property
    def id(self) -> str:
        return f"{self.section}-{self.number}"


def slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text`` (Python ones aside) that hold a command."""
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) == "python":
            continue
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.MULTILINE)
        section = slug(headings[-1]) if headings else "top"
        number = 1 + sum(block.section == section for block in found)
        if any(isinstance(step, Command) for step in steps(match.group(2))):
            found.append(Block(section, number, match.group(2)))
    return found


def logical_lines(text: str) -> list[str]:
    """Lines with their ``\\`` continuations joined and their here-documents attached."""
    lines, out = text.splitlines(), []
    while lines:
        line = lines.pop(0)
        while line.endswith("\\") and lines:
            line = line[:-1] + " " + lines.pop(0).strip()
        heredoc = HEREDOC.search(line)
        if heredoc:
            end = lines.index(heredoc.group(1))
            line = "\n".join([line, *lines[: end + 1]])
            del lines[: end + 1]
        out.append(line)
    return out


def parse_command(tokens: list[str], cwd: str = ".") -> Command | None:
    """``[cd DIR &&] fedjax-het ...`` as a ``Command``; ``[cd DIR &&] srun [OPTS] fedjax-het
    ...`` as one to check; ``ssh HOST "..." [&]`` as one to start; anything else: None."""
    if tokens[:1] == ["cd"] and tokens[2:3] == ["&&"]:
        return parse_command(tokens[3:], str(Path(cwd) / tokens[1]))
    if tokens[:1] == ["fedjax-het"] and not PLACEHOLDER.search(" ".join(tokens)):
        return Command(tokens[1:], cwd)
    if tokens[:1] == ["srun"]:
        rest = tokens[1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        inner = parse_command(rest, cwd)
        return inner and dataclasses.replace(inner, how="srun")
    if tokens[:1] == ["ssh"] and len(tokens) >= 3:
        inner = parse_command(shlex.split(tokens[2], comments=True), cwd)
        return inner and dataclasses.replace(inner, how="ssh")
    return None


def as_command(line: str) -> Command | None:
    """The command on ``line`` (its first line: a here-document is shell), if it is one."""
    try:
        tokens = shlex.split(line.split("\n")[0], comments=True)
    except ValueError:  # unbalanced quotes: shell the test need not read
        return None
    return parse_command(tokens) if tokens else None


def steps(text: str) -> list[Command | str]:
    """A block as commands and shell scripts (consecutive other lines), in order; the comment
    lines right under a command (no blank line between) are its output."""
    out: list[Command | str] = []
    showing: Command | None = None
    for line in logical_lines(text):
        if showing is not None and line.strip().startswith("#"):
            showing.output.append(line.strip().lstrip("#").strip())
            continue
        if line.startswith("fedjax-het ") and PLACEHOLDER.search(line):
            continue  # a synopsis line, not a command
        showing = command = as_command(line)
        if command is not None:
            out.append(command)
        elif out and isinstance(out[-1], str):
            out[-1] += "\n" + line
        elif line.strip() and not line.strip().startswith("#"):
            out.append(line)
    return out


def shortened(argv: list[str]) -> list[str]:
    if argv[:1] in (["run"], ["sweep"]):
        return [*argv, *SHORT]
    if argv[:2] == ["hetero", "describe"]:
        return [*argv, *SHORT_DESCRIBE]
    return argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def on_localhost(argv: list[str], port: int) -> list[str]:
    key = "distributed.coordinator_address="
    return [f'{key}"localhost:{port}"' if a.startswith(key) else a for a in argv]


def start_processes(commands: list[Command], folder: Path) -> None:
    """The ``ssh`` commands of a block, each in a process of its own, all at once."""
    port = free_port()
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "fedjax_het.front.cli", *on_localhost(shortened(c.argv), port)],
            cwd=folder / c.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for c in commands
    ]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * len(processes), "\n".join(outputs)
    assert "final test accuracy" in outputs[0]


def check_output(shown: list[str], printed: str) -> None:
    lines = [line.strip() for line in printed.splitlines()]
    for line in shown:
        start = re.match(r"[^\d\[]*", line).group(0)
        if start and not start.startswith("..."):
            assert any(p.startswith(start) for p in lines), (start, printed)


def check_numbers(shown: list[str], printed: str) -> None:
    """Every piece of each shown line between its ``...`` elisions, numbers included, is in
    one of the printed lines (what the full-size run prints, to the digit)."""
    lines = [line.strip() for line in printed.splitlines()]
    for line in shown:
        for piece in (p.strip() for p in line.split("...")):
            assert not piece or any(piece in p for p in lines), (piece, printed)


def run_here(command: Command, folder: Path, monkeypatch, capsys, full: bool = False) -> None:
    monkeypatch.chdir(folder / command.cwd)
    if command.how == "srun":  # no SLURM here: the arguments parse and the config is valid
        args = cli.parser().parse_args(command.argv)
        config.cluster(config.load(args.config, args.set))
        return
    capsys.readouterr()
    code = cli.main([*command.argv, *ONE_DEVICE] if full else shortened(command.argv))
    printed = capsys.readouterr()
    assert code == 0, (command.argv, printed.out, printed.err)
    (check_numbers if full else check_output)(command.output, printed.out + printed.err)


def run_block(block: Block, folder: Path, monkeypatch, capsys, full: bool = False) -> None:
    """Runs ``block``'s steps, shortened; ``full``: as written, only the commands that show
    their output (and the shell lines before them), checking every number they show."""
    started: list[Command] = []
    for step in [*steps(block.text), None]:
        if full and isinstance(step, Command) and not step.output:
            continue
        if started and not (isinstance(step, Command) and step.how == "ssh"):
            start_processes(started, folder)
            started = []
        if isinstance(step, str):
            subprocess.run(
                ["bash", "-euo", "pipefail", "-c", step],
                cwd=folder,
                check=True,
                env={**os.environ, "HOME": str(folder)},
            )
        elif isinstance(step, Command) and step.how == "ssh":
            started.append(step)
        elif isinstance(step, Command):
            run_here(step, folder, monkeypatch, capsys, full)


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_examples_are_found_and_parse():
    """The examples this test runs are there, and every command's arguments parse."""
    sections = {block.section for block in BLOCKS}
    assert {
        "heterogeneity-in-one-config",
        "sweeps-a-grid-of-runs-compiled-once",
        "scale-several-devices-and-hosts",
    } <= sections
    commands = [s for block in BLOCKS for s in steps(block.text) if isinstance(s, Command)]
    assert {c.how for c in commands} == {"here", "ssh", "srun"}
    for command in commands:
        cli.parser().parse_args(command.argv)


def test_steps_split_shell_commands_and_their_output():
    text = (
        "mkdir -p exp\ncat > exp/c.toml <<'EOF'\nrounds = 5\nEOF\n"
        "fedjax-het run exp/c.toml \\\n  --set seed=1\n# final test accuracy 0.5 (best 0.5)\n"
        "# ... 15 rounds ...\n\n# a comment\n"
        'ssh node0 "cd exp && fedjax-het run c.toml" &\n'
        "cd exp && srun --nodes=2 fedjax-het run c.toml\n"
        "fedjax-het compare RUN_DIR... [--x round]\n"
    )
    shell, run, ssh, srun = steps(text)
    assert shell == "mkdir -p exp\ncat > exp/c.toml <<'EOF'\nrounds = 5\nEOF"
    assert run == Command(
        ["run", "exp/c.toml", "--set", "seed=1"],
        ".",
        ["final test accuracy 0.5 (best 0.5)", "... 15 rounds ..."],
    )
    assert ssh == Command(["run", "c.toml"], "exp", how="ssh")
    assert srun == Command(["run", "c.toml"], "exp", how="srun")
    check_output(run.output, "x\nfinal test accuracy 0.61 (best 0.7)\n")
    with pytest.raises(AssertionError):
        check_output(run.output, "best test accuracy 0.61\n")


@pytest.mark.slow  # 10 to 70 s a block on the 2-core CI CPU, 5 minutes in all
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_readme_example_runs(block, tmp_path, monkeypatch, capsys):
    run_block(block, tmp_path, monkeypatch, capsys)


SHOWN = [b for b in BLOCKS if any(isinstance(s, Command) and s.output for s in steps(b.text))]


def test_the_shown_outputs_are_the_ones_checked_at_full_size():
    expected = {"heterogeneity-in-one-config", "differential-privacy", "compressed-updates"}
    assert {b.section for b in SHOWN} >= expected
    check_numbers(["a 0.5 (b 1) ... 7 rounds"], "x\na 0.5 (b 1), c 2; 7 rounds\n")
    with pytest.raises(AssertionError):
        check_numbers(["a 0.646 (b 1)"], "a 0.6480 (b 1)\n")


@pytest.mark.slow  # the README's numbers at the README's sizes: each block's full run
@pytest.mark.parametrize("block", SHOWN, ids=[block.id for block in SHOWN])
def test_readme_numbers_at_full_size(block, tmp_path, monkeypatch, capsys):
    run_block(block, tmp_path, monkeypatch, capsys, full=True)
