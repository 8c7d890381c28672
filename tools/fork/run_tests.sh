#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# The test command: for every upstream base make or reuse its dev venv (.venv
# for the default, .venv-<version> for the others) and run pytest against it;
# lint once, with the first base's tools.
#   bash tools/fork/run_tests.sh [pytest args]
# VLLM_FORK_BASES="0.34.0" limits the run to the bases named.
# VLLM_FORK_PYTEST_WORKERS=N sets each base's pytest workers (default: the
# cores, at most four).
# VLLM_FORK_DROP_VENVS=1 deletes each base's dev venv after its tests (.ci/run:
# a clean clone keeps nothing).
#
# The bases are independent, so they run side by side: every dev venv is made
# at once (pip waits on the network and the disk more than on a core), and
# each base's pytest starts as soon as its venv is ready, on every core
# (pytest-xdist). Each base's output is kept apart and printed whole when its
# run ends, with the time each phase took.
set -euo pipefail
cd "$(dirname "$0")/../.."

read -r default_base all_bases < <(python3 - <<'EOF'
import runpy
pin = runpy.run_path("tools/fork/pin.py")
print(pin["DEFAULT_BASE"], " ".join(pin["BASES"]))
EOF
)
read -r -a bases <<<"${VLLM_FORK_BASES:-$all_bases}"

venv_of() {
  if [ "$1" = "$default_base" ]; then echo .venv; else echo ".venv-$1"; fi
}
timed() { echo "[tests] $1: $((SECONDS - $2)) s (at ${SECONDS} s)"; }

# pytest workers a base: every core, at most four (each worker holds its own
# vLLM and torch, over a GB); two bases on two cores share them.
cores=$(nproc)
workers=${VLLM_FORK_PYTEST_WORKERS:-$((cores < 4 ? cores : 4))}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
declare -A venv_job pytest_job pytest_start
failed=()

for base in "${bases[@]}"; do
  python3 tools/fork/dev_env.py --base "$base" >"$logs/venv-$base.log" 2>&1 &
  venv_job[$base]=$!
done

# pytest against one base, in the background; its output goes to its log.
start_pytest() {
  local base=$1 venv cases=all select=()
  venv=$(venv_of "$base")
  shift
  # To keep CI short, two things run in full against the default base only:
  # the plan report's command-line table (a few cases elsewhere) and the
  # tests marked default_base_only (each says why it can be spared).
  if [ "$base" != "$default_base" ]; then
    cases=few
    select=(-m "not default_base_only")
  fi
  # --durations: the slowest tests, for keeping .ci/run short. Each test
  # file stays on one worker, so a module's fixtures (a built wheel, a
  # patched tree) are made once.
  VLLM_FORK_BASE="$base" DSV41_PLAN_REPORT_CASES="$cases" \
    "$venv/bin/python" -m pytest --durations=15 -n "$workers" --dist loadfile \
    "${select[@]}" "$@" \
    >"$logs/pytest-$base.log" 2>&1 &
  pytest_job[$base]=$!
  pytest_start[$base]=$SECONDS
}

linted=no
for base in "${bases[@]}"; do
  started=$SECONDS
  if ! wait "${venv_job[$base]}"; then
    cat "$logs/venv-$base.log" >&2
    failed+=("$base (its dev venv could not be made)")
    continue
  fi
  grep -v '^WARNING: Location' "$logs/venv-$base.log" >&2 || true
  timed "dev venv $(venv_of "$base") ready, waited" "$started"
  start_pytest "$base" "$@"
  if [ "$linted" = no ]; then
    started=$SECONDS
    # shellcheck disable=SC1091
    source "$(venv_of "$base")/bin/activate"
    pre-commit run --all-files --show-diff-on-failure || failed+=("lint")
    deactivate
    linted=yes
    timed "lint" "$started"
  fi
done

for base in "${bases[@]}"; do
  [ -n "${pytest_job[$base]:-}" ] || continue
  status=0
  wait "${pytest_job[$base]}" || status=$?
  echo "=== pytest against vLLM $base ($(venv_of "$base")) ==="
  cat "$logs/pytest-$base.log"
  timed "pytest against vLLM $base" "${pytest_start[$base]}"
  # pytest exits 5 when it collected nothing; that is a failure here too.
  if [ "$status" -eq 5 ]; then
    echo "no tests were collected against vLLM $base" >&2
  fi
  [ "$status" -eq 0 ] || failed+=("pytest against vLLM $base (exit $status)")
  if [ "${VLLM_FORK_DROP_VENVS:-0}" = 1 ]; then
    rm -rf "$(venv_of "$base")"
  fi
done
echo "[tests] total: ${SECONDS} s"

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
