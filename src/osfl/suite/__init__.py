"""``osfl suite``: turn the minutes of a lent GPU into REPRODUCTION rows
(issue #32; docs/gpu-suite.md).

- :mod:`osfl.suite.plan`: the catalogue of paper-scale steps in order of
  value, each with its calibration command, and the plan of those that fit;
- :mod:`osfl.suite.execute`: calibrate, plan, run, write the rows;
- :mod:`osfl.suite.pack`: the data and weights a lent machine carries;
- :mod:`osfl.suite.mfu`: the MFU benchmark of one training step.
"""
