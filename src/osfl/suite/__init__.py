"""``osfl suite``: turn the minutes of a lent GPU into REPRODUCTION rows
(issues #32, #40; docs/gpu-suite.md).

- :mod:`osfl.suite.steps`: a step (one command) and its work, the
  constants the catalogue shares and prices its work in;
- :mod:`osfl.suite.catalogue`: the paper-scale steps in order of value,
  each with its work and its tiny dry-run command;
- :mod:`osfl.suite.plan`: the steps selected, and those whose estimates
  (work over the measured rates) fit a budget;
- :mod:`osfl.suite.rates`: the measurement phase, this machine's rates
  (training images per second, decoding, resizing, start-up);
- :mod:`osfl.suite.execute`: ``osfl suite run``: measure, plan, run each
  step, write the rows, go on from a previous call;
- :mod:`osfl.suite.rows`: a finished step's rows and ``reproduction_gpu.md``;
- :mod:`osfl.suite.bundle`: the flat folder a job hands back after every
  finished step, within a lent machine's return limits;
- :mod:`osfl.suite.importer`: ``osfl suite import``: a bundle's rows into
  ``reproduction/`` and REPRODUCTION.md;
- :mod:`osfl.suite.pack`: the data (an in-memory image pack), weights and
  wheels a lent machine carries;
- :mod:`osfl.suite.mfu`: the MFU benchmark of one training step.
"""
