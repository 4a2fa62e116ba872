"""The ``fedjax-het`` command's entry point: the command imported under a Ctrl-C guard.

Importing the command imports JAX, XLA and the models (seconds); Ctrl-C in that time ends
the command with one line and exit code 130, not a traceback of the import it stopped.
Everything after the import is ``fedjax_het.front.cli.main``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

INTERRUPTED = 130  # 128 + SIGINT, as the run's own Ctrl-C (training.interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    """``fedjax_het.front.cli.main``, once its modules are imported; 130 if Ctrl-C stops that."""
    try:
        from fedjax_het.front import cli
    except KeyboardInterrupt:
        print("fedjax-het: interrupted while starting (importing JAX); nothing was run",
              file=sys.stderr)
        return INTERRUPTED
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
