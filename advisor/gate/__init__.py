"""Numeric checks against the fp32 reference: whether a candidate computes what PyTorch computes.

- `metrics`: the relative errors every check uses.
- `layer`: each conv layer alone against float64 (the sharp test of a kernel or a precision).
- `training`: the training check's task and runs; `reference_runs`: its fp32 side (the rate
  fp32 learns at, the reference, the band).
- `precision`: the training check that judges a reduced precision on the model itself;
  `held_out`: its look on held-out batches, where a precision trails only near the floor of
  memorising the check's batches.
- `numeric`: `Gate`, which holds the references and combines both into one verdict.
"""
