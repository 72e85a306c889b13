#!/usr/bin/env bash
# bench/model_parallel: model parallelism of the GPT, loom next to PyTorch
# (gloo on CPU) in the same run. For kjv-gpt (4 layers, d_model 128, context
# 128) and gpt85 (the ~85M-parameter byte GPT of bench/zero.sh: 12 layers,
# d_model 768, 12 heads, context 256), at 2 and 4 ranks x 1 thread, each
# with the same global batch: DDP (the batch split over the ranks), pipeline
# parallel with gpipe and 1f1b at M = 4 and 8 micro-batches (loom's
# parallel.pp / micro_batches / pp_schedule; PyTorch's
# torch.distributed.pipelining ScheduleGPipe / Schedule1F1B) and tensor
# parallel (loom's parallel.tp, run only when `loom config check` accepts
# parallel.tp=2, else "not built"; PyTorch's ColwiseParallel /
# RowwiseParallel). Per row: tokens/s (median step, steps 2..), each side's
# peak RSS of its largest rank, loom's measured pipeline bubble next to the
# theory (P-1)/(M+P-1), and where loom's step goes (rank 0: forward,
# backward, blocked on the pipeline, blocked on reductions). A PyTorch
# strategy that fails here shows the first line of its error.
#   usage: bench/model_parallel.sh [BUILD_DIR]
# Environment: MODELS ("kjv-gpt gpt85"), RANKS ("2 4"), MICRO ("4 8"),
# SCHEDULES ("gpipe 1f1b"), STRATEGIES ("ddp pp tp"), STEPS (per model:
# 6 for kjv-gpt, 3 for gpt85; the first is not timed), ROUNDS (1: every row's
# loom and PyTorch runs repeated, the rows in turn; the table keeps the
# median step over all rounds and the median of the rounds' loom/PyTorch
# ratios), KJV_BATCH (32 rows), GPT85_BATCH (8 rows), NO_TORCH=1 or TORCH=0
# (loom only), RAW=FILE (keep the JSON rows).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-$LOOM_ROOT/build}
LOOM="$BUILD/loom"
[ -x "$LOOM" ] || { echo "build it first: make build" >&2; exit 1; }
MODELS=${MODELS:-kjv-gpt gpt85} RANKS=${RANKS:-2 4} MICRO=${MICRO:-4 8}
SCHEDULES=${SCHEDULES:-gpipe 1f1b} STRATEGIES=${STRATEGIES:-ddp pp tp} ROUNDS=${ROUNDS:-1}
torch=0
bench_torch_peer && torch=1
bench_check_load
bench_fair_env 1
export LOOM_THREADS=1 LOOM_LOG=warn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rows=${RAW:-$tmp/rows.jsonl}
: >"$rows"
# throughput does not depend on the text; small, since the final evaluation
# reads all of the held-out 10%
head -c 30000 /dev/urandom | base64 >"$tmp/text.txt"

shape() { # MODEL: layers d_model heads context global-batch steps
  case $1 in
  kjv-gpt) echo 4 128 4 128 "${KJV_BATCH:-32}" "${STEPS:-6}" ;;
  gpt85) echo 12 768 12 256 "${GPT85_BATCH:-8}" "${STEPS:-3}" ;;
  *) echo "bench/model_parallel: unknown model $1 (kjv-gpt, gpt85)" >&2; exit 2 ;;
  esac
}

# Does this loom have tensor parallelism? (the config check refuses tp > 1
# until it does)
tp_built=0
"$LOOM" config check "$LOOM_ROOT/examples/small_gpt.yaml" --set parallel.tp=2 >/dev/null 2>&1 && tp_built=1
echo "# peer: ${TORCH_PEER:-PyTorch: skipped}, gloo on CPU; OMP_WAIT_POLICY=PASSIVE, 1 thread a rank"
echo "# loom tensor parallel: $([ $tp_built = 1 ] && echo built || echo "not built (loom config check refuses parallel.tp=2)")"

# MODEL RANKS STRATEGY M ROUND: loom train on RANKS ranks x 1 thread; a
# JSON row (or one with "error") appended to $rows.
loom_one() {
  local m=$1 n=$2 s=$3 mb=$4 round=$5 L C H T B S d rb extra=()
  read -r L C H T B S <<<"$(shape "$m")"
  d="$tmp/run_${m}_${n}_${s}_${mb}"
  rm -rf "$d" "$d".rss.*
  case $s in
  ddp) rb=$((B / n)) extra=(--set parallel.strategy=ddp) ;;
  gpipe | 1f1b) rb=$B extra=(--set parallel.pp="$n" --set parallel.micro_batches="$mb"
    --set parallel.pp_schedule="$s") ;;
  tp) rb=$B extra=(--set parallel.tp="$n") ;;
  esac
  local rc=0
  # shellcheck disable=SC2016 # the inner sh expands them, once per rank
  "$LOOM" run -n "$n" --threads 1 --timeout 3000 sh -c \
    '/usr/bin/time -f %M -o "$0.rss.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" "$@"' "$d" \
    "$LOOM" train "$LOOM_ROOT/examples/small_gpt.yaml" --resume never --quiet \
    --set model.layers="$L" --set model.d_model="$C" --set model.heads="$H" \
    --set model.context="$T" --set train.batch_size="$rb" --set train.steps="$S" \
    --set checkpoint.every=0 --set log.every=1 --set train.eval_every=0 \
    --set train.eval_batches=1 --set "data.path=$tmp/text.txt" --set "log.run_dir=$d" \
    "${extra[@]}" >"$d.out" 2>&1 || rc=$?
  python3 - "$d" "$m" "$n" "$s" "$mb" "$round" "$B" "$T" "$rc" >>"$rows" <<'PY'
import glob, json, statistics, sys
d, m, n, s, mb, rnd, b, t, rc = sys.argv[1:]
row = {"side": "loom", "model": m, "ranks": int(n), "strategy": s,
       "micro_batches": int(mb) if s in ("gpipe", "1f1b") else None, "round": int(rnd)}
try:
    lines = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"step_s"' in l]
except OSError:
    lines = []
if rc != "0" or not lines:
    out = [l.strip() for l in open(d + ".out", errors="replace") if l.strip()]
    err = next((l for l in out if "error" in l.lower() or "loom:" in l), out[-1] if out else "no output")
    print(json.dumps({**row, "error": err[:160]}))
    sys.exit(0)
timed = lines[1:] or lines
med = lambda k: statistics.median(l[k] for l in timed) if all(k in l for l in timed) else None
rss = {int(f.rsplit(".", 1)[1]): int(open(f).read().split()[-1]) / 1024
       for f in glob.glob(d + ".rss.*")}
row.update(step_s=[l["step_s"] for l in timed], tokens_per_step=int(b) * int(t),
           rss_mb_ranks=[round(rss[k], 1) for k in sorted(rss)],
           mem_params_mb=lines[-1].get("mem_params_mb"),
           forward_s=med("forward_s"), backward_s=med("backward_s"),
           pp_wait_s=med("pp_wait_s"),
           # pipelines log each rank's only (the tied weight, the replicas' sum)
           comm_wait_s=med("comm_wait_s") if "comm_wait_s" in timed[0]
           else (statistics.median(l["rank_comm_wait_s"][0] for l in timed)
                 if "rank_comm_wait_s" in timed[0] else None),
           pp_bubble=med("pp_bubble"), pp_bubble_theory=lines[-1].get("pp_bubble_theory"),
           pp_bubble_expected=med("pp_bubble_expected") if "pp_bubble_expected" in timed[0] else None,
           rank_pp_bubble=[round(statistics.median(l["rank_pp_bubble"][i] for l in timed), 3)
                           for i in range(len(timed[0].get("rank_pp_bubble", [])))])
print(json.dumps(row))
PY
}

# MODEL RANKS STRATEGY M ROUND: the same with PyTorch.
torch_one() {
  [ $torch = 1 ] || return 0
  local m=$1 n=$2 s=$3 mb=$4 round=$5 L C H T B S
  read -r L C H T B S <<<"$(shape "$m")"
  OMP_WAIT_POLICY=PASSIVE "$TORCH_PYTHON" "$BENCH_DIR/torch/model_parallel.py" --strategy "$s" \
    --ranks "$n" --micro-batches "$mb" --layers "$L" --d-model "$C" --heads "$H" \
    --context "$T" --batch "$B" --steps "$S" --port "$(bench_free_port)" \
    2>"$tmp/torch.err" >"$tmp/torch.out" || true
  python3 - "$tmp/torch.out" "$m" "$round" >>"$rows" <<'PY'
import json, sys
out = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not out:
    out = [{"error": "no result (see stderr)"}]
r = out[-1]
row = {"side": "pytorch", "model": sys.argv[2], "ranks": r.get("ranks"), "strategy": r.get("strategy"),
       "micro_batches": r.get("micro_batches"), "round": int(sys.argv[3])}
if "error" in r:
    row["error"] = r["error"]
else:
    row.update(step_s=[r["step_s"]], tokens_per_step=r["batch"] * r["context"],
               rss_mb_ranks=r["rss_mb_ranks"], params=r["params"], params_rank=r["params_rank"])
print(json.dumps(row))
PY
  grep -q '"error"' "$tmp/torch.out" && tail -3 "$tmp/torch.err" >&2
  return 0
}

row() { # MODEL RANKS STRATEGY M ROUND: loom, then PyTorch
  if [ "$3" = tp ] && [ $tp_built = 0 ]; then
    echo "{\"side\": \"loom\", \"model\": \"$1\", \"ranks\": $2, \"strategy\": \"tp\", \"round\": $5, \"error\": \"not built\"}" >>"$rows"
  else
    loom_one "$@"
  fi
  torch_one "$@"
}

for m in $MODELS; do
  read -r L C H T B S <<<"$(shape "$m")"
  echo "# $m: $L layers, d_model $C, $H heads, context $T, byte vocabulary; global batch $B rows x $T tokens a step; AdamW f32; $S steps, the first not timed"
  for n in $RANKS; do
    for ((r = 1; r <= ROUNDS; r++)); do
      for s in $STRATEGIES; do
        case $s in
        ddp | tp) row "$m" "$n" "$s" 1 "$r" ;;
        pp) for sch in $SCHEDULES; do for mb in $MICRO; do row "$m" "$n" "$sch" "$mb" "$r"; done; done ;;
        *) echo "bench/model_parallel: unknown strategy $s (ddp, pp, tp)" >&2; exit 2 ;;
        esac
      done
    done
  done
done
echo "# load average at the end: $(bench_loadavg)"

python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
acc = {}
for r in rows:
    k = (r["model"], r["ranks"], r["strategy"], r.get("micro_batches"))
    acc.setdefault(k, {}).setdefault(r["side"], []).append(r)

def tput(rs):
    ok = [r for r in rs or [] if "error" not in r]
    if not ok:
        return None
    return statistics.median(r["tokens_per_step"] / s for r in ok for s in r["step_s"])

def ratio(k):
    lo = {r["round"]: r for r in acc[k].get("loom", []) if "error" not in r}
    pt = {r["round"]: r for r in acc[k].get("pytorch", []) if "error" not in r}
    rs = sorted(tput([lo[i]]) / tput([pt[i]]) for i in lo if i in pt)
    if not rs:
        return "-"
    med = statistics.median(rs)
    return f"{med:.2f}x" + (f" ({rs[0]:.2f}-{rs[-1]:.2f})" if len(rs) > 1 else "")

def cell(rs, f):
    if not rs:
        return "-"
    bad = [r for r in rs if "error" in r]
    if len(bad) == len(rs):
        return bad[0]["error"]
    return f([r for r in rs if "error" not in r])

def rss(rs):
    ok = [r for r in rs or [] if "error" not in r]
    if not ok:
        return "-"
    return (f"{max(max(r['rss_mb_ranks']) for r in ok):.0f}/"
            f"{min(min(r['rss_mb_ranks']) for r in ok):.0f}")

def fmt(x, p="{:.0f}"):
    return p.format(x) if x is not None else "-"

hdr = ["model", "ranks", "strategy", "M", "loom tok/s", "pt tok/s", "loom/pt", "bubble",
       "theory", "expected", "bubble/rank", "loom RSS MB", "pt RSS MB", "loom fwd/bwd/pp/comm ms"]
out = []
errors = []
for k, sides in acc.items():
    m, n, s, mb = k
    lo, pt = sides.get("loom"), sides.get("pytorch")
    good = [r for r in lo or [] if "error" not in r]
    g = good[0] if good else {}
    bub = statistics.median(r["pp_bubble"] for r in good) if good and g.get("pp_bubble") is not None else None
    exp = (statistics.median(r["pp_bubble_expected"] for r in good)
           if good and g.get("pp_bubble_expected") is not None else None)
    ms = lambda key: statistics.median(r[key] for r in good) * 1e3 if good and g.get(key) is not None else None
    parts = "/".join(fmt(ms(x)) for x in ("forward_s", "backward_s", "pp_wait_s", "comm_wait_s"))
    def show_err(rs, side):
        c = cell(rs, lambda ok: fmt(tput(ok)))
        if rs and all("error" in r for r in rs) and rs[0]["error"] != "not built":
            errors.append(f"{side} {m} {s}{'' if mb is None else ' M=' + str(mb)} x{n}: {c}")
            return "error (below)"
        return c
    out.append([m, n, s, "-" if mb is None else mb, show_err(lo, "loom"), show_err(pt, "pytorch"),
                ratio(k), fmt(bub, "{:.3f}"), fmt(g.get("pp_bubble_theory"), "{:.3f}"), fmt(exp, "{:.3f}"),
                ",".join(f"{b:.2f}" for b in g.get("rank_pp_bubble", [])) or "-",
                rss(lo), rss(pt),
                parts if good else "-"])
w = [max(len(str(c)) for c in col) for col in zip(hdr, *out)]
print("model_parallel (tokens/s: median step over all rounds; loom/pt: median of the rounds' ratios; "
      "bubble: loom's pp_bubble, mean over ranks, median over steps; theory: (P-1)/(M+P-1); "
      "expected: pp_bubble_expected, what the stages' measured compute gives a fill-drain schedule with no delay "
      "between stages (the theory for unequal stages); RSS: peak MB of the largest/smallest rank; "
      "fwd/bwd/pp/comm: rank 0's median ms a step computing forward, backward, blocked on the "
      "pipeline, blocked on reductions)")
print("  " + "  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)).rstrip())
for r in out:
    print("  " + "  ".join(str(c).rjust(w[i]) if i > 2 else str(c).ljust(w[i]) for i, c in enumerate(r)))
for e in errors:
    print("  error:", e)
PY
