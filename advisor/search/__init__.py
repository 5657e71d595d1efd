"""The optuna search. With `advisor.search.storage` (and the report, which reads studies), the only
code that imports optuna: `options` (what is asked and returned), `study` (the study and its
grid), `run` (the trials), `outcome` (what a search found, read back from its study), `storage`
(opening storages, the per-layer companion study, records shared between runs), `point_lock`
(PostgreSQL: one process measures a point), `sqlite_claim` (SQLite: one process owns a popped
trial), `screen` (a few samples of every candidate before the survivors are timed in full),
`ledger` (the one record of what a run measured: every stage, the pick, the report and the
reuse read a candidate's standing from it), `shared_checks` (precision verdicts known to every
study of a model on this machine). `pick` (the pick, a pure function of the ledger's standings and
the rule), `pick_gates` (the verdicts a pick needs, asked for when it needs them) and
`compile_bill` (what a one-off cost, a compile or cuDNN's search, costs and saves) decide from
the results.

PyTorch's default configuration is enqueued first and is the baseline. When the whole grid fits the
budget every point is enqueued (each evaluated exactly once, even with many workers on one study);
otherwise a TPE sampler explores after the default. A candidate that fails or is rejected by the
numeric gate is a FAIL trial with its reason, and the study goes on.

Every process that runs trials (`advisor advise`, `advisor worker`) runs the same loop:
1. reclaim orphans: a RUNNING trial whose process (on this host) is gone is failed; heartbeats do
   the same for other hosts on a database storage;
2. enqueue the grid points that have neither a result nor a WAITING/RUNNING trial, so a trial
   lost to a kill -9, a Ctrl-C or a dead worker is run again; a point whose process died
   `RETRIES + 1` times is recorded as failed instead;
3. run WAITING trials; a trial whose point already has a result, or a lower-numbered trial
   running or waiting, is pruned as a duplicate, so racing workers never measure a point twice
   (on PostgreSQL the point is also locked while it is measured: `point_lock`);
4. while other processes hold RUNNING trials, wait for them (and for their heartbeats).
"""
