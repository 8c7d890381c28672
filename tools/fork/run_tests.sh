#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
# The test command: dev venv (made or reused), lint, then pytest.
#   bash tools/fork/run_tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."

python3 tools/fork/dev_env.py
# shellcheck disable=SC1091
source .venv/bin/activate

pre-commit run --all-files --show-diff-on-failure

# pytest exits 5 when it collected nothing; that is a failure here.
status=0
python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "no tests were collected" >&2
fi
exit "$status"
