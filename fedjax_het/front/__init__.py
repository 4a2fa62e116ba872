"""The front doors: a TOML config to a run (``config``, its [model] table in ``model_schema``),
the ``fedjax-het`` command (``cli``), ``explain``, ``compare``, and many runs as one program
(``sweep``, and the ``sweep`` command's grids in ``grid``)."""
