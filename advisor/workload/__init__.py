"""What is tuned: a layer spec, a model file or a live model, made into a `Workload` that can run
a step.

- `layer_spec`: `LayerSpec`, a conv layer as written in PyTorch (parsed, never evaluated).
- `sizes`, `preflight`: absurd sizes rejected before anything is allocated.
- `model_file`: importing a model file or module and calling its factories, seeded.
- `build`: `Workload` (model factory, fresh inputs, shape sets) made from each kind of source.
- `info`: `WorkloadInfo`, the typed, JSON-stable description a worker rebuilds a workload from.
- `args`: the workload options of the API and CLI, turned into a workload.
"""
