#!/usr/bin/env bash
# bench/ab_builds.sh: a change measured on a noisy machine. Two or more loom
# builds (say the release before, built in a git worktree, and this one) run
# `loom bench train` on the same rows; each round runs every (build,
# precision) once, in an order rotated by one place a round, so a drift of
# the machine's clock falls on all of them alike. Noise only ever adds time,
# so besides the median the table gives the minimum and the 25th percentile
# of the step time, which move least from run to run on a shared VM; each
# build's step over the first build's, and within a build each precision's
# step over its f32 step (issue 13's "bf16 <= 1.15x f32" on a CPU without
# bf16 instructions), at each statistic. The CPU model and flags come first.
#   usage: bench/ab_builds.sh BUILD_DIR_A BUILD_DIR_B [BUILD_DIR...]
# Environment: MODELS (fashion-mlp; comma-separated, as loom bench train's
# --model), PRECISIONS ("f32 bf16"), THREADS ("1 2"), ROUNDS (10), STEPS
# (100: timed steps a run), RAW=FILE (keep the result lines), BENCH_ISA=avx2
# (bench/lib.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
if [ $# -lt 2 ]; then
  echo "usage: bench/ab_builds.sh BUILD_DIR_A BUILD_DIR_B [BUILD_DIR...]" >&2
  exit 2
fi
builds=()
for b in "$@"; do
  [ -x "$b/loom" ] || {
    echo "ab_builds: $b/loom: no loom binary there (build it first)" >&2
    exit 2
  }
  builds+=("$(cd "$b" && pwd)")
done
MODELS=${MODELS:-fashion-mlp}
PRECISIONS=${PRECISIONS:-f32 bf16}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-10}
STEPS=${STEPS:-100}
case "$ROUNDS$STEPS" in *[!0-9]*)
  echo "ab_builds: ROUNDS and STEPS are whole numbers (got '$ROUNDS', '$STEPS')" >&2
  exit 2
  ;;
esac
bench_check_load
bench_cap_isa
# each build's source and its commit, where the build says which
for i in "${!builds[@]}"; do
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "${builds[$i]}/CMakeCache.txt" 2>/dev/null || true)
  rev=$([ -n "$src" ] && git -C "$src" describe --always --dirty 2>/dev/null || echo "commit unknown")
  echo "# build $((i + 1)): ${builds[$i]} ($("${builds[$i]}/loom" --version 2>/dev/null | head -1), ${src:-source unknown} at $rev)"
done
echo "# $ROUNDS rounds of $STEPS timed steps a run, order rotated each round; OMP_WAIT_POLICY=PASSIVE"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=${RAW:-$tmp/results.jsonl}
: >"$out"

IFS=, read -ra models <<<"$MODELS"
read -ra precs <<<"$PRECISIONS"
for t in $THREADS; do
  bench_fair_env "$t"
  for m in "${models[@]}"; do
    # every (build, precision) of the row, rotated one place each round
    runs=()
    for i in "${!builds[@]}"; do
      for p in "${precs[@]}"; do runs+=("$i $p"); done
    done
    n=${#runs[@]}
    for ((r = 0; r < ROUNDS; r++)); do
      for ((j = 0; j < n; j++)); do
        read -r i p <<<"${runs[$(((j + r) % n))]}"
        if ! LOOM_THREADS=$t "${builds[$i]}/loom" bench train --model "$m" --threads "$t" \
          --steps "$STEPS" --precision "$p" --json >"$tmp/line" 2>"$tmp/err"; then
          bench_note "failed: build $((i + 1)) $m $p $t threads: $(tail -1 "$tmp/err")"
          continue
        fi
        grep '^{' "$tmp/line" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r["build"] = int(sys.argv[1])
    print(json.dumps(r))' "$((i + 1))" >>"$out"
      done
    done
  done
done
echo "# load average at the end: $(bench_loadavg)"
python3 - "$out" <<'PY'
import collections, json, statistics, sys

rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[(r["model"], r["threads"], r["precision"], r["build"])].append(r["step_s"] * 1e3)

def p25(v):
    return sorted(v)[len(v) // 4]

stats = {k: (min(v), p25(v), statistics.median(v), len(v)) for k, v in rows.items()}
print("ab_builds (step ms: min / p25 / median of the rounds; vs build 1 and "
      "t/f32 at the same statistic)")
print(f"  {'model':12s} {'thr':>3s} {'prec':5s} {'build':>5s} {'min':>8s} {'p25':>8s} "
      f"{'median':>8s} {'n':>3s}  {'vs build 1 (min/p25/med)':>26s}  {'t/f32 (min/p25/med)':>22s}")
for key in sorted(stats):
    m, t, p, b = key
    s = stats[key]
    base = stats.get((m, t, p, 1))
    f32 = stats.get((m, t, "f32", b))
    vs = "/".join(f"{s[i] / base[i]:.3f}" for i in range(3)) if base and b != 1 else "-"
    tf = "/".join(f"{s[i] / f32[i]:.3f}" for i in range(3)) if f32 and p != "f32" else "-"
    print(f"  {m:12s} {t:3d} {p:5s} {b:5d} {s[0]:8.3f} {s[1]:8.3f} {s[2]:8.3f} {s[3]:3d}  {vs:>26s}  {tf:>22s}")
PY
