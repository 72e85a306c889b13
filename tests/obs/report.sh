#!/usr/bin/env bash
# loom report RUN: the verdict on runs built to have each bottleneck (a slow
# loader through LOOM_FAULT slow_data; a straggler rank through slow; a
# large model with little compute and one unoverlapped bucket over MPI for
# communication; a plain run for compute); the page rendered by headless
# Chromium (every plot drawn: its colours in the screenshot, its elements in
# the DOM); --png; a run still being written (and a half-written line);
# errors. Also log.per_rank's files and the per-rank and memory-category
# numbers of metrics.jsonl these plots read.
. "$(dirname "$0")/../lib.sh"
export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
cat "$SRC"/docs/*.md | head -c 200000 >"$tmp/text.txt"
gpt=("$SRC/examples/small_gpt.yaml" --set "data.path=$tmp/text.txt" --set train.steps=24
  --set log.every=4 --set train.eval_every=12 --set train.eval_batches=1
  --set checkpoint.enabled=false --quiet)
small=(--set model.layers=1 --set model.d_model=32 --set model.heads=2 --set model.context=32
  --set train.batch_size=2)

verdict() { # RUN WANT WHAT: the page's verdict names WANT
  if ! "$LOOM" report "$1" >"$tmp/rep.out" 2>&1; then
    bad "$3: loom report failed: $(cat "$tmp/rep.out")"
    return
  fi
  if grep -q "<div class=\"verdict[^\"]*\" id=\"verdict\"><p><b>$2" "$1/report.html"; then
    ok "$3: the verdict says '$2'"
  elif grep -q "Also: $2" "$1/report.html"; then
    ok "$3: the verdict says '$2' (second finding)"
  else
    bad "$3: the verdict does not say '$2': $(grep '^verdict' "$tmp/rep.out")"
  fi
}

# --- compute: one rank, nothing in its way; per-rank log of one rank.
"$LOOM" train "${gpt[@]}" --set model.layers=2 --set model.d_model=64 --set model.heads=2 \
  --set model.context=64 --set train.batch_size=16 --set data.prefetch=8 --set log.run_dir="$tmp/compute" \
  --set log.per_rank=true >"$tmp/out" 2>&1 || bad "compute run: $(tail -3 "$tmp/out")"
verdict "$tmp/compute" "Compute bound" "a plain run"
# --- data loading: every batch 20 ms late.
LOOM_FAULT=0:2:slow_data:0.02 "$LOOM" train "${gpt[@]}" "${small[@]}" \
  --set log.run_dir="$tmp/data" >"$tmp/out" 2>&1 || bad "slow data run: $(tail -3 "$tmp/out")"
verdict "$tmp/data" "Data-loading bound" "a slow loader"
grep -q "raise data.prefetch\|Raise data.prefetch (now 2)" "$tmp/data/report.html" &&
  ok "the data verdict names data.prefetch and its value" || bad "no data.prefetch advice"
# --- a straggler: rank 1 sleeps 30 ms after each step; per-rank logs.
LOOM_FAULT=1:2:slow:0.03 "$LOOM" run -n 2 --timeout 120 "$LOOM" train "${gpt[@]}" "${small[@]}" \
  --set log.run_dir="$tmp/skew" --set log.per_rank=true >"$tmp/skew.out" 2>&1 ||
  bad "straggler run: $(tail -3 "$tmp/skew.out")"
verdict "$tmp/skew" "Imbalanced ranks: rank 1" "a straggler"
# --- communication: 55 MB of gradients, 4 tokens of compute, one bucket
# (nothing overlaps backward), over MPI rather than shared memory.
LOOM_COMM_SHM=0 "$LOOM" run -n 2 --timeout 300 "$LOOM" train "${gpt[@]}" --set train.steps=12 \
  --set data.val_fraction=0.002 \
  --set log.every=3 --set model.layers=2 --set model.d_model=768 --set model.heads=2 \
  --set model.context=4 --set train.batch_size=1 --set optim.name=sgd \
  --set parallel.bucket_mb=4096 --set log.run_dir="$tmp/comm" >"$tmp/out" 2>&1 ||
  bad "communication run: $(tail -3 "$tmp/out")"
verdict "$tmp/comm" "Communication bound" "a large model with little compute"

# --- what the plots read: per-rank arrays, memory by category, the logs.
PY=python3
"$PY" - "$tmp/skew/metrics.jsonl" "$tmp/compute/metrics.jsonl" <<'PY' >"$tmp/check" 2>&1
import json, sys
two = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l]
one = [json.loads(l) for l in open(sys.argv[2]) if '"step_s"' in l]
for r in two:
    for k in ("rank_busy_s", "rank_data_wait_s", "rank_comm_wait_s"):
        assert isinstance(r[k], list) and len(r[k]) == 2, (k, r.get(k))
    assert r["busy_skew"] >= 1, r["busy_skew"]
    # The straggler's 30 ms sleeps are its busy time after its first steps.
    assert r["mem_comm_mb"] > 0, "two ranks on one host share a segment"
    assert r["mem_data_mb"] > 0
late = two[-1]
assert late["rank_busy_s"][1] > late["rank_busy_s"][0] + 0.02, late["rank_busy_s"]
for r in one:
    assert "rank_busy_s" not in r and "busy_skew" not in r
    assert r["mem_comm_mb"] == 0, r["mem_comm_mb"]
    # The text twice (train and val splits) at least.
    assert r["mem_data_mb"] >= 2 * 200000 / 2**20, r["mem_data_mb"]
print("ok")
PY
grep -q '^ok$' "$tmp/check" && ok "metrics.jsonl: each rank's parts, busy_skew, comm and data memory" ||
  bad "metrics.jsonl's rank and memory numbers: $(cat "$tmp/check")"
for r in 0 1; do
  f="$tmp/skew/logs/rank-$r.log"
  if [ -f "$f" ] && grep -Eq '^20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z ---- rank '"$r"' of 2 on ' "$f" &&
    [ "$(grep -c ': [0-9.]* s a step over ' "$f")" = 6 ]; then
    ok "log.per_rank: rank-$r.log has its header and 6 window lines, time-stamped"
  else
    bad "log.per_rank: rank-$r.log: $(head -3 "$f" 2>&1)"
  fi
done
grep -q "fault injected: slow" "$tmp/skew/logs/rank-1.log" &&
  ok "rank 1's warning is in its log" || bad "rank 1's warning is not in its log"
grep -q "fault injected: slow" "$tmp/skew.out" &&
  ok "rank 1's warning still reaches the console" || bad "rank 1's warning left the console"
[ -f "$tmp/compute/logs/rank-0.log" ] && ok "one rank: logs/rank-0.log" || bad "one rank: no log"
[ ! -e "$tmp/data/logs" ] && ok "log.per_rank off: no logs/" || bad "logs/ without log.per_rank"

# --- the page in Chromium: a screenshot with every plot's ink, and the DOM.
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
  bad "chromium is not installed (scripts/install-deps.sh installs it)"
else
  "$LOOM" report "$tmp/skew" -o "$tmp/page.html" --png "$tmp/png" >"$tmp/rep.out" 2>&1 ||
    bad "loom report -o --png: $(cat "$tmp/rep.out")"
  chrome=("$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars
    --no-first-run)
  timeout 120 "${chrome[@]}" --user-data-dir="$tmp/chrome1" --window-size=960,2400 --screenshot="$tmp/shot.png" \
    "file://$tmp/page.html" >"$tmp/chrome.out" 2>&1
  timeout 120 "${chrome[@]}" --user-data-dir="$tmp/chrome2" --dump-dom "file://$tmp/page.html" >"$tmp/dom.html" 2>"$tmp/chrome.err"
  "$PY" - "$tmp/shot.png" "$tmp/dom.html" "$tmp/png" <<'PY' >"$tmp/check" 2>&1
import os, re, struct, sys, zlib

def png(path):  # 8-bit RGB/RGBA, not interlaced: (w, h, rows of pixel tuples)
    b = open(path, "rb").read()
    assert b[:8] == b"\x89PNG\r\n\x1a\n", path
    i, idat, ihdr = 8, b"", None
    while i < len(b):
        n, t = struct.unpack(">I4s", b[i:i + 8])
        d = b[i + 8:i + 8 + n]
        assert zlib.crc32(t + d) == struct.unpack(">I", b[i + 8 + n:i + 12 + n])[0], (path, t)
        if t == b"IHDR": ihdr = struct.unpack(">IIBBBBB", d)
        if t == b"IDAT": idat += d
        i += 12 + n
    w, h, depth, ctype, _, _, inter = ihdr
    assert depth == 8 and ctype in (2, 6) and inter == 0, ihdr
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            c = prev[x - bpp] if x >= bpp else 0
            up = prev[x]
            if f == 1: line[x] = (line[x] + a) & 255
            elif f == 2: line[x] = (line[x] + up) & 255
            elif f == 3: line[x] = (line[x] + (a + up) // 2) & 255
            elif f == 4:
                p = a + up - c
                pa, pb, pc = abs(p - a), abs(p - up), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else up if pb <= pc else c)) & 255
        rows.append(bytes(line)); prev = line
    return w, h, bpp, rows

def colours(path):
    w, h, bpp, rows = png(path)
    count = {}
    for r in rows:
        for x in range(0, w * bpp, bpp):
            k = r[x:x + 3]
            count[k] = count.get(k, 0) + 1
    return w, h, count

w, h, count = colours(sys.argv[1])
white = count.get(b"\xff\xff\xff", 0)
assert white < 0.97 * w * h, f"the screenshot is blank: {white} of {w*h} white"
# Every series colour of the plots is drawn with some area (bars, lines).
for name, rgb in (("blue", "1f77b4"), ("orange", "ff7f0e"), ("green", "2ca02c"),
                  ("red", "d62728"), ("purple", "9467bd"), ("brown", "8c564b")):
    n = count.get(bytes.fromhex(rgb), 0)
    assert n >= 40, f"{name} #{rgb}: {n} pixels in the screenshot"
dom = open(sys.argv[2]).read()
ids = re.findall(r'<svg class="plot" id="plot-([a-z_]+)"', dom)
want = ["loss", "lr", "throughput", "step_time", "memory", "ranks"]
assert ids == want, ids
for i in want:
    body = dom.split(f'id="plot-{i}"')[1].split("</svg>")[0]
    marks = body.count("<line") + body.count("<rect") + body.count("<circle")
    assert marks >= 12, (i, marks)
assert 'id="verdict"' in dom and 'id="evidence"' in dom and 'id="config"' in dom
assert "cpu" in dom and "model:" in dom
pngs = sorted(os.listdir(sys.argv[3]))
assert pngs == sorted(f"{i}.png" for i in want), pngs
for p in pngs:
    w, h, c = colours(os.path.join(sys.argv[3], p))
    assert (w, h) == (880, 290), (p, w, h)
    assert c.get(b"\xff\xff\xff", 0) < 0.98 * w * h, f"{p} is blank"
    assert c.get(b"\x1f\x77\xb4", 0) >= 20, f"{p}: no first series colour"
print("ok", w, h)
PY
  if grep -q '^ok' "$tmp/check"; then
    ok "Chromium draws every plot (screenshot colours, DOM elements); --png writes them"
  else
    bad "the page in Chromium: $(tail -5 "$tmp/check"); DOM $(wc -c <"$tmp/dom.html") bytes; $(grep -v 'dbus\|^$' "$tmp/chrome.err" | tail -5)"
  fi
  [ -n "${LOOM_REPORT_SHOT:-}" ] && cp "$tmp/shot.png" "$LOOM_REPORT_SHOT"
fi

# --- a run being written: half its lines and a line cut in the middle.
mkdir -p "$tmp/live"
cp "$tmp/compute/env.json" "$tmp/compute/config.yaml" "$tmp/live/"
head -n 3 "$tmp/compute/metrics.jsonl" >"$tmp/live/metrics.jsonl"
sed -n 4p "$tmp/compute/metrics.jsonl" | head -c 60 >>"$tmp/live/metrics.jsonl"
if "$LOOM" report "$tmp/live" >"$tmp/rep.out" 2>&1 &&
  grep -q "In progress or stopped: step 12 of 24" "$tmp/live/report.html"; then
  ok "a run being written: its progress so far (step 12 of 24), the cut line left out"
else
  bad "a run being written: $(cat "$tmp/rep.out"; grep -o 'id="status">[^<]*' "$tmp/live/report.html")"
fi
# A line that is not JSON in the middle is skipped and said.
{ head -n 2 "$tmp/compute/metrics.jsonl"; echo '{"step": oops'; sed -n '3,$p' "$tmp/compute/metrics.jsonl"; } >"$tmp/live/metrics.jsonl"
"$LOOM" report "$tmp/live" >"$tmp/rep.out" 2>&1 &&
  grep -q "1 unreadable lines skipped, the first at line 3" "$tmp/live/report.html" &&
  ok "an unreadable line is skipped and said" || bad "unreadable line: $(cat "$tmp/rep.out")"

# --- a long run: 5,000 windows are drawn as 300 bars, the last at the last
# step (each the mean of its windows), not cut short.
python3 - "$tmp/compute/metrics.jsonl" "$tmp/long" <<'PY'
import json, os, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l]
os.makedirs(sys.argv[2], exist_ok=True)
with open(sys.argv[2] + "/metrics.jsonl", "w") as f:
    for i in range(5000):
        r = dict(lines[i % len(lines)])
        r["step"] = i + 1
        f.write(json.dumps(r) + "\n")
PY
if "$LOOM" report "$tmp/long" >"$tmp/rep.out" 2>&1; then
  python3 - "$tmp/long/report.html" <<'PY' >"$tmp/check" 2>&1
import re, sys
page = open(sys.argv[1]).read()
for plot in ("step_time", "memory"):
    body = page.split(f'id="plot-{plot}"')[1].split("</svg>")[0]
    xs = sorted({round(float(x) + float(w) / 2, 1) for x, w in re.findall(r'<rect x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)"', body) if float(w) < 5})
    assert 250 <= len(xs) <= 300, (plot, len(xs))
    ticks = [int(t) for t in re.findall(r'>([0-9]+)</text>', body)]
    assert max(ticks) >= 4000, (plot, max(ticks))
print("ok")
PY
  grep -q '^ok' "$tmp/check" && ok "a long run: 5,000 windows as 300 bars to the last step" ||
    bad "a long run: $(tail -4 "$tmp/check")"
else
  bad "a long run: $(cat "$tmp/rep.out")"
fi

# --- errors.
mkdir -p "$tmp/empty"
"$LOOM" report "$tmp/empty" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "empty/metrics.jsonl" "$tmp/out" &&
  ok "no metrics.jsonl: exit 1 naming the file" || bad "no metrics: rc $rc: $(cat "$tmp/out")"
"$LOOM" report "$tmp/nothere" >"$tmp/out" 2>&1
[ $? = 2 ] && grep -q "not a run directory" "$tmp/out" &&
  ok "not a directory: exit 2" || bad "not a directory: $(cat "$tmp/out")"
"$LOOM" report >"$tmp/out" 2>&1
[ $? = 2 ] && ok "no run: exit 2" || bad "no run: $(cat "$tmp/out")"
# -o at a link: refused as --trace -o refuses it; link and target untouched.
echo victim >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/link.html"
"$LOOM" report "$tmp/compute" -o "$tmp/link.html" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && [ "$(cat "$tmp/victim")" = victim ] && [ -L "$tmp/link.html" ] &&
  grep -q "link.html: a symbolic link is in its place" "$tmp/out" &&
  ok "-o at a symbolic link: refused, link and target untouched" ||
  bad "-o at a link: rc $rc: $(cat "$tmp/out")"
# -o at a pipe (no reader) or a directory: refused at once, never replaced
# or waited for (as root, -o /dev/null had removed the device).
mkfifo "$tmp/fifo.html"
timeout 60 "$LOOM" report "$tmp/compute" -o "$tmp/fifo.html" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && [ -p "$tmp/fifo.html" ] && grep -q "fifo.html: it is not a regular file" "$tmp/out" &&
  ok "-o at a pipe: refused, the pipe left" || bad "-o at a pipe: rc $rc: $(cat "$tmp/out")"
mkdir "$tmp/dir.html"
"$LOOM" report "$tmp/compute" -o "$tmp/dir.html" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && [ -d "$tmp/dir.html" ] && grep -q "dir.html: it is not a regular file" "$tmp/out" &&
  ok "-o at a directory: refused" || bad "-o at a directory: rc $rc: $(cat "$tmp/out")"

finish obs_report
