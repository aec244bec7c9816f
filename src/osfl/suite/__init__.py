"""``osfl suite``: turn the minutes of a lent GPU into REPRODUCTION rows
(issues #32, #40, #50; docs/gpu-suite.md).

- :mod:`osfl.suite.steps`: a step (one command) and its work, the
  constants the catalogue shares and prices its work in;
- :mod:`osfl.suite.catalogue`: the paper-scale steps in order of value,
  each with its work and its tiny dry-run command;
- :mod:`osfl.suite.lease`: what a lease's two commands hold for steps;
- :mod:`osfl.suite.pricing`: a step's estimate (work over the rates, times
  its learned factor), and the rate that would bring it in reach;
- :mod:`osfl.suite.learn`: the factors learned from finished and killed
  steps' seconds, kept in the repository;
- :mod:`osfl.suite.plan`: the steps selected, and their places in a lease
  (a row's client part only with its row; the rest out of reach);
- :mod:`osfl.suite.preview`: ``osfl suite plan``, successive leases
  previewed without a GPU;
- :mod:`osfl.suite.rates`: the measurement phase, this machine's rates
  (training images per second, decoding, resizing, start-up);
- :mod:`osfl.suite.preflight`: the first minute, every method once on the
  GPU and every import the catalogue needs;
- :mod:`osfl.suite.execute`: ``osfl suite run``: preflight, measure, plan,
  run each step, write the rows, go on from a previous call (around each
  step: :mod:`osfl.suite.step_io`);
- :mod:`osfl.suite.encoder`: the suite's bf16 ViT-Ti/16, returned once and
  kept in the repository;
- :mod:`osfl.suite.rows`: a finished step's rows and ``reproduction_gpu.md``;
- :mod:`osfl.suite.bundle`: the flat folder a job hands back after every
  finished step, within a lent machine's return limits;
- :mod:`osfl.suite.importer`: ``osfl suite import``: a bundle's rows into
  ``reproduction/`` and REPRODUCTION.md;
- :mod:`osfl.suite.pack`: the data (an in-memory image pack), weights and
  wheels a lent machine carries;
- :mod:`osfl.suite.mfu`: the MFU benchmark of one training step.
"""
