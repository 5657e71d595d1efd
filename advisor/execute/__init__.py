"""Running candidates: in this process or in isolated workers that survive the user's code.

- `runner`: `evaluate()`, timing and gating one candidate on every shape.
- `gating`: the gate's capture and verdict of a candidate; `gate_only()`, its checks alone.
- `park`: screened candidates kept built and warm for their full timing.
- `evaluators`: the `Evaluator` protocol, in-process evaluation, `Lent`; `make_evaluator` chooses.
- `isolate`, `worker_process`, `probe`: worker subprocesses (time limits, crashes, hangs), the
  loop they run, and the first run of a model file's code in one.
- `retime`: the finalists re-timed together, interleaved; `benchmark_processes`: a process per
  `cudnn.benchmark` value on CUDA; `first_calls`: its twins' first calls, taken before anything
  else runs there.
- `payback`: a compiled candidate timed beside its eager rival, stopped before the gate's capture
  when its cold compile cannot pay back within the horizon.
- `children`: how a child process starts (forked from a server that imported torch, or spawned);
  `preloaded`: the server's last import, which freezes what it imported.
- `ownership`: which process owns a running trial; `streams`: user prints kept off stdout.
- `profiling`: with `$ADVISOR_PROFILE_DIR` set, a cProfile of every advisor process's life.
"""
