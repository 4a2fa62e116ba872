"""The progress bars of the host loops: ``loop.train_loop``'s rounds, GANDALF's GAN phase
and its mediator rounds. One look for all (``tqdm.auto``, kept on screen when done, off
when ``progress`` is False) and one accuracy postfix.
"""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm


def bar(total: int, *, desc: str, unit: str, progress: bool, initial: int = 0) -> tqdm:
    """A bar of ``total`` ``unit``s (``initial`` already done: a resumed run); silent unless
    ``progress``. The caller advances it (``update``) and closes it."""
    return tqdm(
        total=total, initial=initial, desc=desc, unit=unit, disable=not progress, leave=True
    )


def accuracy(value) -> str:
    """A bar's accuracy postfix: one run's, or a sweep's cells' range (not their mean, which
    mixes settings that may differ by tens of points).

    >>> accuracy(0.5), accuracy([0.5, 0.25, 0.75])
    ('acc=0.500', 'acc 0.250-0.750 over 3 cells')
    """
    values = np.atleast_1d(np.asarray(value, np.float64))
    if values.size == 1:
        return f"acc={values[0]:.3f}"
    return f"acc {values.min():.3f}-{values.max():.3f} over {values.size} cells"
