#!/usr/bin/env bash
# Runs one CLI test script in a fresh scratch folder. Usage: run_cli_test.sh SCRIPT
set -euo pipefail
script=$1
name=$(basename "$script" .sh)
export WORK="${WORK_ROOT:-/tmp/attnscope-cli}/$name"
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$WORK"
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$script")/lib.sh"
source "$script"
