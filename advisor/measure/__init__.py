"""Measuring one candidate honestly, and what a measurement is.

- `timing`: `measure()`, the `Sampler` (the one clock) and the one interleaving sampler.
- `stats`: `Measurement` (raw samples, median, CI), "faster beyond noise", speedups, the race rule.
- `candidate`: one candidate ready to run (its model, inputs and training step), with captures.
- `canonical_dropout`: the same dropout units in every candidate's capture.
- `results`: `TrialResult`; `verdict`: a precision check's settings and verdict.
- `memory`: a trial's own peak memory; `machine_load`: other processes' share of the CPU; `roofline`: floors from measured peaks.
"""
