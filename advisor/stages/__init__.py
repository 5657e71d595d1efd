"""What runs after the search, each within the run's budget.

- `effort`: what each effort level (quick, default, full) runs of the stages below.
- `budget`: the run's time split into stages, and what a stage left out.
- `finalists`: the best candidates re-timed together, interleaved, before any pick.
- `later`: candidates measured after the eager search, on its finalists.
- `benchmark_twins`: cudnn.benchmark on the search's finalists, in a process of its own.
- `layer_groups`: conv layers grouped by signature and input, one measurement a group.
- `per_layer`: conv groups x implementations on the best settings.
- `autotune_bound`: where an implementation that autotunes (Triton) can pay for it.
- `layer_share`: the groups that carry the conv work, measured at default effort.
- `compiling`: torch.compile candidates and their cold compile costs.
- `walltime`: each stage's wall time, shown as it ends and kept in the result.
- `confirm`: the pick, the default and the runner-up of another family timed together once
  more (the final check's run-level part).
- `final_check`: the recommendation against the default in a fresh process, as `apply` builds it.
"""
