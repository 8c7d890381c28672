#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# The test command: a dev venv per upstream base (made or reused), lint once,
# then pytest against every base (.venv for the default, .venv-<version> for
# the others).
#   bash tools/fork/run_tests.sh [pytest args]
# VLLM_FORK_BASES="0.33.0" limits the run to the bases named.
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

for base in $bases; do
  python3 tools/fork/dev_env.py --base "$base"
done

# Lint once, with the first base's tools.
lint_venv=$(venv_of "${bases%% *}")
# shellcheck disable=SC1091
source "$lint_venv/bin/activate"
pre-commit run --all-files --show-diff-on-failure
deactivate

failed=()
for base in $bases; do
  venv=$(venv_of "$base")
  echo "=== pytest against vLLM $base ($venv) ==="
  # pytest exits 5 when it collected nothing; that is a failure here too.
  # Two things that do not depend on the base run in full against the
  # default base only, to keep the run short: the plan report's command-line
  # table (a few cases elsewhere) and installing the fork wheel into a fresh
  # venv (the main job installs and smoke-checks every base's wheel).
  cases=all
  select=()
  if [ "$base" != "$default_base" ]; then
    cases=few
    select=(-m "not install")
  fi
  status=0
  VLLM_FORK_BASE="$base" DSV41_PLAN_REPORT_CASES="$cases" \
    "$venv/bin/python" -m pytest "${select[@]}" "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "no tests were collected against vLLM $base" >&2
  fi
  [ "$status" -eq 0 ] || failed+=("$base (exit $status)")
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "pytest failed against vLLM ${failed[*]}" >&2
  exit 1
fi
