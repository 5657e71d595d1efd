"""Measuring one candidate honestly, and what a measurement is.

- `timing`: `measure()`, the `Sampler` (the one clock) and the one interleaving sampler.
- `stopping`: when a measurement's sampling stops, and how many samples a GPU batch takes.
- `settle`: when a warm-up goes on until the step has settled (the first step in its layout in a
  process).
- `gpu_clock`: the GPU's side of it (an L2 flush, clocks brought up, a spin kernel).
- `updates`: the optimizer updates of the timed step and the training check, without
  `torch.optim` (whose first use imports `torch._dynamo`).
- `stats`: `Measurement` (raw samples, median, CI), "faster beyond noise", speedups, the race rule.
- `candidate`: one candidate ready to run (its model, inputs and training step), with captures.
- `canonical_dropout`: the same dropout units in every candidate's capture.
- `seeded`: torch's, Python's and NumPy's generators from one seed for a capture, put back after.
- `results`: `TrialResult`; `stop`: why a candidate is out of the pick (a kind and its figures);
  `verdict`: a precision check's settings and verdict.
- `contest`: the one rule for "can this candidate still win?", with its margins and horizon.
- `memory`: a trial's own peak memory; `machine_load`: other processes' share of the CPU; `roofline`: floors from measured peaks.
"""
