"""Numeric checks against the fp32 reference: whether a candidate computes what PyTorch computes.

- `metrics`: the relative errors every check uses.
- `layer`: each conv layer alone against float64 (the sharp test of a kernel or a precision).
- `precision`: the training check that judges a reduced precision on the model itself.
- `numeric`: `Gate`, which holds the references and combines both into one verdict.
"""
