#!/usr/bin/env bash
# Runs `make test` RUNS times in a row (default 3) while BUSY processes (default: one per core) spin on
# the CPUs, to show that the suite passes on a machine that other jobs load. Prints each run's result,
# wall time and load average; the logs go to LOG_DIR. Exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
busy=${BUSY:-$(nproc)}
logs=${LOG_DIR:-bench-results/test-under-load}
mkdir -p "$logs"

spinners=()
stop_spinners() {
  ((${#spinners[@]})) && kill "${spinners[@]}" 2>/dev/null
  wait 2>/dev/null
}
trap stop_spinners EXIT
for _ in $(seq "$busy"); do
  (while :; do :; done) &
  spinners+=($!)
done
echo "$busy busy processes started; $runs runs of make test"

failed=0
for run in $(seq "$runs"); do
  started=$(date +%s)
  if make test >"$logs/run-$run.log" 2>&1; then result=passed; else result=FAILED; failed=1; fi
  elapsed=$(($(date +%s) - started))
  summary=$(grep -E '^[=]* ?[0-9]+ (passed|failed)' "$logs/run-$run.log" | tail -1 | tr -d '=')
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "run $run: $result in ${elapsed} s (load average $load):${summary}"
done
exit $failed
