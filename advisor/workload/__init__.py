"""What is tuned: a layer spec, a model file or a live model, made into a `Workload` that can run
a step.

- `layer_call`, `layer_spec`: `Conv2d(3, 16, 3)` read with `ast` (never evaluated) into a
  `LayerSpec`, the layer and what it is fed.
- `sizes`, `preflight`: absurd sizes rejected before anything is allocated.
- `model_file`: importing a model file or module and calling its factories, seeded.
- `build`: `Workload` (model factory, fresh inputs) made from each kind of source;
  `shape_sets` spreads one over several shapes or batch sizes; `rebuild` makes one again from
  its description; `deferred` is a model file's workload from its description, loaded from
  the file only when first used.
- `info`: `WorkloadInfo`, the typed, JSON-stable description a worker rebuilds a workload from.
- `args`: the workload options of the API and CLI, turned into a workload.
- `copying`: a deep copy of a model or layer, also of one holding a hook-computed weight.
"""
