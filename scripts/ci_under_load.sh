#!/usr/bin/env bash
# CI on a busy machine: `.ci/run` from a clean clone of this repository's HEAD, with N busy loops
# (default 2) running beside it, as on a shared CI machine. Prints the wall time and exits with
# .ci/run's exit code.
#
#   scripts/ci_under_load.sh 2                                          # the real thing
#   CI_CMD="python3 -m pytest -q tests/test_pick.py" scripts/ci_under_load.sh 2   # a quick try
#
# - The clone (git clone, then HEAD's commit checked out) leaves out uncommitted and untracked
#   files: what runs is what was committed.
# - `.ci/run` installs the project (`pip install -e .`): it runs inside a fresh virtual
#   environment made with --system-site-packages, so the installed torch (CPU build) and the other
#   dependencies are reused (nothing is downloaded) and the machine's own environment, and
#   whatever it has installed in editable mode, is left as it was.
# - The busy loops and the temporary folder are removed on exit, Ctrl-C included.
set -euo pipefail

loops="${1:-2}"
root="$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
commit="$(git -C "$root" rev-parse HEAD)"
work="$(mktemp -d "${TMPDIR:-/tmp}/ci-under-load.XXXXXX")"
pids=()

cleanup() {
  if ((${#pids[@]})); then kill "${pids[@]}" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

git clone --quiet "$root" "$work/repo"
git -C "$work/repo" checkout --quiet --detach "$commit"
python3 -m venv --system-site-packages "$work/venv"

for ((i = 0; i < loops; i++)); do
  python3 -c 'while True: pass' &
  pids+=($!)
done

echo "ci_under_load: ${commit:0:12} with $loops busy loop(s) beside it: ${CI_CMD:-bash .ci/run}"
start=$SECONDS
set +e
(
  cd "$work/repo"
  # The venv's python3 first on PATH; nothing from the caller's PYTHONPATH (e.g. a worktree).
  unset PYTHONPATH
  export PATH="$work/venv/bin:$PATH" VIRTUAL_ENV="$work/venv"
  eval "${CI_CMD:-bash .ci/run}"
)
rc=$?
set -e
echo "ci_under_load: exit code $rc after $((SECONDS - start)) s (wall) with $loops busy loop(s)"
exit "$rc"
