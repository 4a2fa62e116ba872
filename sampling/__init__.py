"""Client selection (``fedjax_het.sampling``)."""

from fedjax_het.sampling.uniform import uniform

__all__ = ["uniform"]
