"""A checkpoint is untrusted input: a crafted or foreign ``checkpoint.npz`` is refused by
``fedjax-het run --resume`` in one line, in our words, before anything trains.

Each case starts from a real checkpoint (a 2-round run) and changes one thing: the
manifest's structure (a JSON list, a key missing, an unknown dtype), its round counter
against the arrays (999 rounds done, where the records hold 2), or the file itself (random
bytes, a pickled object) — for which numpy's own message would suggest ``allow_pickle``.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import zipfile

import numpy as np
import pytest

from fedjax_het.front import cli
from fedjax_het.training import checkpoint

TINY = [
    'data.name="synthetic"', "data.num_clients=8", "sampler.clients_per_round=3",
    "model.name=mlp", "model.hidden=[8]", "rounds=2", "eval_every=2", "engine.devices=1",
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "run"
    sets = [a for s in TINY for a in ("--set", s)]
    assert cli.main(["run", *sets, "--out", str(out), "--no-progress"]) == 0
    return out


def rewrite(out, change_manifest=None, change_arrays=None) -> None:
    """Rewrites ``out/checkpoint.npz`` with its manifest and arrays changed."""
    path = out / checkpoint.FILE
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    manifest = json.loads(str(arrays.pop("__manifest__")))
    if change_manifest is not None:
        manifest = change_manifest(manifest)
    if change_arrays is not None:
        change_arrays(arrays)
    np.savez(path, __manifest__=np.asarray(json.dumps(manifest)), **arrays)


def with_(key, value):
    return lambda m: {**m, key: value}


def without(key):
    return lambda m: {k: v for k, v in m.items() if k != key}


def pickled(arrays):
    arrays["state/x"] = np.asarray([{"a": 1}], dtype=object)


def bfloat16_claimed(arrays):
    arrays["state/bits"] = np.zeros(3, np.uint16)


CASES = {
    "a JSON list": (lambda m: [m], "its manifest is a JSON list, not an object"),
    "no dtypes": (without("dtypes"), "its manifest's 'dtypes' is missing"),
    "an unknown dtype": (with_("dtypes", {"state/bits": "float7"}), "names 'float7' for"),
    "a dtype numpy knows": (with_("dtypes", {"state/bits": "float32"}), "names 'float32' for"),
    "a dtype of a missing array": (with_("dtypes", {"nothing": "bfloat16"}), "has no such array"),
    "done 999": (with_("done", 999), "says 999 rounds were done, its records hold [2]"),
    "done 1": (with_("done", 1), "says 1 rounds were done, its records hold [2]"),
    "done negative": (with_("done", -1), "says -1 rounds"),
    "done a string": (with_("done", "2"), "its manifest's 'done' is '2'"),
    "config not TOML": (with_("config", "= ="), "its manifest's config is not TOML"),
    "evaluations of two runs": (lambda m: {**m, "evaluations": m["evaluations"] * 2},
                                "evaluations of 2 run(s), this is 1"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_crafted_manifest_is_refused_in_one_line(finished, tmp_path, capsys, case):
    change, message = CASES[case]
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    rewrite(out, change, bfloat16_claimed)
    code = cli.main(["run", "--resume", str(out), "--set", "rounds=4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and message in err, err
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2  # nothing trained


@pytest.mark.parametrize("content", ["random", "pickle", "not npy"])
def test_a_foreign_file_is_refused_without_suggesting_pickles(finished, tmp_path, capsys, content):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / checkpoint.FILE
    if content == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif content == "pickle":
        rewrite(out, change_arrays=pickled)
    else:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("__manifest__.npy", b"not an array")
        path.write_bytes(buffer.getvalue())
    code = cli.main(["run", "--resume", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert re.search(r"checkpoint.npz is not a (readable|usable) checkpoint: \w", err), err
    assert "allow_pickle" not in err and "Traceback" not in err


def test_the_real_checkpoint_still_resumes(finished, tmp_path):
    """The checks refuse only what is wrong: the untouched checkpoint resumes to 4 rounds."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    assert cli.main(["run", "--resume", str(out), "--set", "rounds=4", "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())["rounds"] == 4
