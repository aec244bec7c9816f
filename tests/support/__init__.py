"""What several test modules share (no test module imports another one):
tiny tasks and tolerances (``tiny``), the registry-wide smoke task (``smoke``),
a simulated accelerator (``simulated_device``), repository scripts loaded as
modules (``scripts``), paths (``paths``), and the helpers of one family that
more than one of its files use. ``pythonpath = ["tests"]`` (pyproject.toml)
makes it importable as ``support``."""
