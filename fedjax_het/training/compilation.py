"""How a run's programs are compiled: matmul precision and the persistent compilation cache.

Two ``[engine]`` options (``simulate.run`` and ``sweep.sweep`` take them as keywords):

``matmul_precision``: "highest" (the default), "high" or "default": the precision of
float32 matrix products and convolutions, ``jax.default_matmul_precision`` around
everything a run traces (training blocks, evaluation, a sweep's programs). Precision is
baked into each ``dot_general`` when it is traced (``precision = [HIGHEST, HIGHEST]`` in
the StableHLO), so the option must be active while ``jit`` traces, not when it runs.

* On CPU all three are the same float32 arithmetic (XLA:CPU has no faster mode).
* On NVIDIA GPUs (Ampere and later) "default" multiplies float32 in TF32 (10-bit
  mantissa): a float32 run then differs from a float32 reference by about 1e-2 relative
  and from the same run on CPU; "high" uses three bfloat16 passes (bf16x3, close to
  float32, faster than "highest"); "highest" is true float32, slowest.
* On TPUs "default" is one bfloat16 pass.

"highest" is the default so that ``precision = "float32"`` means float32 on every backend
and a GPU run reproduces a CPU one to float32 rounding; "default" trades that for
throughput. Float64 runs (``precision = "float64"``) are unaffected, and a
``precision = "bfloat16"`` run's bfloat16 products are bfloat16 whatever this says.

``compile_cache``: true (the default) keeps every compiled program in JAX's persistent
compilation cache, so that a second run of the same config (another process) loads its
programs instead of compiling them. The cache is keyed by the program itself (its
StableHLO, so precision and shapes included), the compile options, XLA flags, devices and
the jax/jaxlib versions: a changed config or upgrade compiles afresh, never wrongly
reuses. It lives in (:func:`cache_dir`)

1. ``$FEDJAX_HET_CACHE_DIR``, if set;
2. else a directory JAX was already given (``JAX_COMPILATION_CACHE_DIR`` or
   ``jax.config.update("jax_compilation_cache_dir", ...)``);
3. else ``$XDG_CACHE_HOME/fedjax_het/xla``, else ``~/.cache/fedjax_het/xla``.

It grows with every new program (a few hundred KB each) and is never pruned; delete the
directory to empty it. Anyone who can write to it can run code in your runs (JAX's
warning), so it is created readable and writable by its owner only. Programs with host
callbacks (``engine.client_state = "host"``) are compiled every time: JAX does not cache
them. ``false`` turns the cache off for the process.

:func:`applied` applies both around a run and counts what the run compiled
(:func:`record`: programs, cache hits, entries written, seconds compiling), which the
run's ``summary.json`` keeps under ``compile_cache`` beside ``matmul_precision``.
Importing this module starts no JAX backend.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax

MATMUL_PRECISIONS = ("default", "high", "highest")
"""The values of ``engine.matmul_precision`` (``jax.default_matmul_precision``'s)."""
DEFAULT_MATMUL_PRECISION = "highest"
ENV_DIR = "FEDJAX_HET_CACHE_DIR"

_HITS = "/jax/compilation_cache/cache_hits"
_WRITES = "/jax/compilation_cache/cache_misses"  # recorded when an entry is written
_COMPILE = "/jax/core/compile/backend_compile_duration"  # an XLA compile or a cache load


def check_matmul_precision(value: Any, key: str = "matmul_precision") -> str:
    """``value`` if it is one of :data:`MATMUL_PRECISIONS`, else a ValueError naming ``key``."""
    if not isinstance(value, str) or value not in MATMUL_PRECISIONS:
        raise ValueError(
            f"{key} must be one of {', '.join(map(repr, MATMUL_PRECISIONS))}, got {value!r}"
        )
    return value


def matmul_precision_in_effect() -> str:
    """The ``jax.default_matmul_precision`` active here ("default" when none is set)."""
    return jax.config.jax_default_matmul_precision or "default"


def cache_dir() -> Path:
    """Where the persistent compilation cache lives (the module docstring's order)."""
    chosen = os.environ.get(ENV_DIR)
    if chosen:
        return Path(chosen).expanduser()
    theirs = jax.config.jax_compilation_cache_dir
    if theirs and theirs != _state.get("dir"):  # set outside fedjax_het
        return Path(theirs).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fedjax_het" / "xla"


# --- the cache's state in this process -------------------------------------------------------

_lock = threading.Lock()
_state: dict[str, Any] = {}  # {"enabled": bool, "dir": str | None}: what configure last set
_counts = {"programs": 0, "hits": 0, "written": 0, "compile_s": 0.0}


def _on_event(event: str, **_: Any) -> None:
    if event == _HITS:
        _counts["hits"] += 1
    elif event == _WRITES:
        _counts["written"] += 1


def _on_duration(event: str, duration_secs: float, **_: Any) -> None:
    if event == _COMPILE:
        _counts["programs"] += 1
        _counts["compile_s"] += duration_secs


def configure(enabled: bool = True) -> str | None:
    """Turns the persistent compilation cache on (in :func:`cache_dir`) or off; returns the
    directory in use (None: off).

    Call it before the first compilation that should be cached; calling it again with the
    same answer changes nothing. The cache takes every program, however small and quick
    to compile (``jax_persistent_cache_min_compile_time_secs = 0``,
    ``jax_persistent_cache_min_entry_size_bytes = -1``): on CPU most programs compile in
    well under JAX's default threshold of one second.
    """
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    with _lock:
        if not _state:
            jax.monitoring.register_event_listener(_on_event)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
        path = None
        if enabled:
            try:
                made = cache_dir()
                made.mkdir(mode=0o700, parents=True, exist_ok=True)
                path = str(made)
            except (OSError, RuntimeError) as err:  # a read-only or no home: compile it all
                warnings.warn(f"fedjax_het: compilation cache off: cannot create its folder: "
                              f"{err}", stacklevel=3)
                enabled = False
        wanted = {"enabled": bool(enabled), "dir": path}
        current = {"enabled": jax.config.jax_enable_compilation_cache,
                   "dir": jax.config.jax_compilation_cache_dir if enabled else None}
        if wanted == _state and current == wanted:
            return path
        # JAX decides once per process whether the cache is used and where: start afresh.
        jax_cache.reset_cache()
        jax.config.update("jax_enable_compilation_cache", bool(enabled))
        if enabled:
            jax.config.update("jax_compilation_cache_dir", path)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        _state.clear()
        _state.update(wanted)
        return path


@dataclasses.dataclass(frozen=True)
class _Session:
    dir: str | None
    start: dict[str, float]


_session: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "fedjax_het_compile_session", default=None
)


def record() -> dict[str, Any] | None:
    """What was compiled since the innermost :func:`applied` began: ``dir`` (the cache, None:
    off), ``programs`` (XLA programs compiled or loaded), ``hits`` (loaded from the cache),
    ``written`` (new cache entries) and ``compile_s`` (seconds compiling or loading them;
    tracing and lowering not included). None outside :func:`applied`."""
    session = _session.get()
    if session is None:
        return None
    now = {k: v - session.start[k] for k, v in _counts.items()}
    return {
        "dir": session.dir,
        "programs": int(now["programs"]),
        "hits": int(now["hits"]),
        "written": int(now["written"]),
        "compile_s": round(now["compile_s"], 3),
    }


@contextlib.contextmanager
def applied(matmul_precision: str = DEFAULT_MATMUL_PRECISION,
            compile_cache: bool = True) -> Iterator[str | None]:
    """Both options around a block: the cache configured (:func:`configure`), then
    ``jax.default_matmul_precision(matmul_precision)`` while the block traces; yields the
    cache directory (None: off). Raises ValueError for an unknown precision, before
    touching anything."""
    check_matmul_precision(matmul_precision)
    path = configure(compile_cache)
    token = _session.set(_Session(path, dict(_counts)))
    try:
        with jax.default_matmul_precision(matmul_precision):
            yield path
    finally:
        _session.reset(token)


def engine_options(fn: Callable) -> Callable:
    """Decorates ``simulate.run`` and ``sweep.sweep``: their ``matmul_precision`` and
    ``compile_cache`` keywords are applied (:func:`applied`) around the whole call."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        with applied(bound.arguments["matmul_precision"], bound.arguments["compile_cache"]):
            return fn(*args, **kwargs)

    return wrapper
