"""The one device seam: every CUDA, cuDNN and oneDNN call or flag the advisor makes.

- `ops`: the CUDA runtime behind one object (`cuda_ops()`), which the CPU stand-ins replace;
  `placement`, `autocast_type`, `device_guard`.
- `flags`: TF32, oneDNN's conv precision (and whether CPU convs run on it) and
  `cudnn.benchmark`, read and written so that every reader keeps working, and put back exactly.
- `global_state`: the rest of PyTorch's process-wide state a step could change, saved and put back.
- `environment`: the machine and library versions a config was tuned on; resolving `--device`.
- `allocator`: the glibc malloc state that measuring and `apply` share on a CPU.

Nothing here imports another folder of the package (only `advisor.errors`).
"""
