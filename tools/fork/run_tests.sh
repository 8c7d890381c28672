#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# The test command: for every upstream base make or reuse its dev venv (.venv
# for the default, .venv-<version> for the others) and run pytest against it;
# lint once, with the first base's tools.
#   bash tools/fork/run_tests.sh [pytest args]
# VLLM_FORK_BASES="0.34.0" limits the run to the bases named.
# VLLM_FORK_DROP_VENVS=1 deletes each base's dev venv after its tests, so that
# a machine with little disk holds at most two bases' packages (the one under
# test and the next one being made) at a time (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/../.."

read -r default_base all_bases < <(python3 - <<'EOF'
import runpy
pin = runpy.run_path("tools/fork/pin.py")
print(pin["DEFAULT_BASE"], " ".join(pin["BASES"]))
EOF
)
bases=${VLLM_FORK_BASES:-$all_bases}

venv_of() {
  if [ "$1" = "$default_base" ]; then echo .venv; else echo ".venv-$1"; fi
}

# The next base's dev venv is made in the background while this base's tests
# run: pip waits on the network and the disk, pytest on a core.
prepare() {
  python3 tools/fork/dev_env.py --base "$1" >"$logs/dev-env-$1.log" 2>&1
}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
read -r -a queue <<<"$bases"
prepared=""
failed=()
linted=no
for i in "${!queue[@]}"; do
  base=${queue[$i]}
  venv=$(venv_of "$base")
  if [ -n "$prepared" ]; then
    wait "$prepared" || true
    cat "$logs/dev-env-$base.log" >&2
  fi
  # Again in the foreground: a no-op once the background run made the venv,
  # and the build (with its error) where that run failed.
  python3 tools/fork/dev_env.py --base "$base"
  prepared=""
  if [ $((i + 1)) -lt "${#queue[@]}" ]; then
    prepare "${queue[$((i + 1))]}" &
    prepared=$!
  fi
  if [ "$linted" = no ]; then
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    pre-commit run --all-files --show-diff-on-failure
    deactivate
    linted=yes
  fi
  echo "=== pytest against vLLM $base ($venv) ==="
  # To keep CI short, two things run in full against the default base only:
  # the plan report's command-line table (a few cases elsewhere) and the
  # tests marked default_base_only (each says why it can be spared).
  cases=all
  select=()
  if [ "$base" != "$default_base" ]; then
    cases=few
    select=(-m "not default_base_only")
  fi
  status=0
  # --durations: the slowest tests, for keeping .ci/run under its 20 minutes.
  VLLM_FORK_BASE="$base" DSV41_PLAN_REPORT_CASES="$cases" \
    "$venv/bin/python" -m pytest --durations=15 "${select[@]}" "$@" || status=$?
  # pytest exits 5 when it collected nothing; that is a failure here too.
  if [ "$status" -eq 5 ]; then
    echo "no tests were collected against vLLM $base" >&2
  fi
  [ "$status" -eq 0 ] || failed+=("$base (exit $status)")
  if [ "${VLLM_FORK_DROP_VENVS:-0}" = 1 ]; then
    rm -rf "$venv"
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "pytest failed against vLLM ${failed[*]}" >&2
  exit 1
fi
