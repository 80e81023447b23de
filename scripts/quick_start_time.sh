#!/usr/bin/env bash
# The README quick start's `ssacli diagnose`, timed in two checkouts as interleaved rounds (docs/performance.md,
# "Start-up"): per round, BEFORE with torch's default threads and with one, then AFTER the same; CPU = user + sys,
# the 1-minute load average beside each run. One warm-up run per tree first (it builds that tree's kernels).
#   scripts/quick_start_time.sh ROUNDS BEFORE_CHECKOUT AFTER_CHECKOUT
set -euo pipefail
rounds=${1:-5}; before=$(realpath "${2:?a checkout}"); after=$(realpath "${3:?a checkout}")
err=$(mktemp); trap 'rm -f "$err"' EXIT
for tree in "$before" "$after"; do (cd "$tree" && PYTHONPATH="$tree" python -m ssacli diagnose >/dev/null 2>&1); done
echo "round side threads cpu_s wall_s load1"
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    tree=$before; [ "$side" = after ] && tree=$after
    for threads in default 1; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      if [ "$threads" = 1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
      (cd "$tree" && PYTHONPATH="$tree" /usr/bin/time -f "%U %S %e" python -m ssacli diagnose >/dev/null 2>"$err")
      read -r user sys wall < <(tail -1 "$err")
      echo "$r $side $threads $(python -c "print(round($user + $sys, 2))") $wall $load"
    done
  done
done
