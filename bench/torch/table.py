#!/usr/bin/python3
"""Prints loom's and PyTorch's benchmark result lines (JSON, one per line) side by side as tables.

Usage: table.py [--headlines OUT] [--peer NAME] [FILE...]
  (default stdin; lines that are not JSON objects are ignored)
--headlines OUT appends the headline figures (train_throughput and ddp_scaling)
to OUT for make bench's summary table: tab-separated measure, unit, loom,
peer, peer name ("-" where not measured); --peer NAME names the peer when
PyTorch gave no line (e.g. why it was skipped).
The record fields are described in bench/torch/README.md ("Result lines").
"""

import json
import sys


def load(paths):
    recs = []
    streams = [open(p) for p in paths] if paths else [sys.stdin]
    for f in streams:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and "bench" in r:
                recs.append(r)
    return recs


def human(x):
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    if x >= 1e3:
        return f"{x / 1e3:.2f}k"
    return f"{x:.1f}"


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def num(x, fmt="{:.2f}"):
    return fmt.format(x) if x is not None else "-"


def show(title, header, rows):
    if not rows:
        return
    w = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    print(title)
    print(("  " + "  ".join(str(h).ljust(w[i]) for i, h in enumerate(header))).rstrip())
    for r in rows:
        print("  " + "  ".join(str(c).rjust(w[i]) if i else str(c).ljust(w[i]) for i, c in enumerate(r)))
    print()


def by_key(recs, bench, key):
    """{key: {impl: last record}} keeping first-seen key order."""
    out = {}
    for r in recs:
        if r.get("bench") == bench and not r.get("summary"):
            out.setdefault(key(r), {})[r.get("impl", "?")] = r
    return out


def load_of(*rs):
    for r in rs:
        if r and r.get("loadavg_start"):
            return str(r["loadavg_start"][0])
    return "-"


def throughput_table(recs):
    # sgemm GFLOP/s per thread count, from loom's `bench gemm` lines if present
    gemm = {}
    for r in recs:
        if r.get("bench") == "gemm" and r.get("gflops"):
            t = r.get("threads", 1)
            gemm[t] = max(gemm.get(t, 0), r["gflops"])
    rows = []
    for (model, threads), impls in by_key(recs, "train_throughput",
                                          lambda r: (r["model"], r.get("threads"))).items():
        lo, pt = impls.get("loom"), impls.get("pytorch")
        g = gemm.get(threads)
        share = lambda r: f"{100 * r['gflops'] / g:.0f}%" if r and r.get("gflops") and g else "-"
        unit = (lo or pt).get("unit", "")
        rows.append([model, threads, unit, human(lo and lo["throughput"]), human(pt and pt["throughput"]),
                     ratio(lo and lo["throughput"], pt and pt["throughput"]),
                     num(lo and lo.get("gflops"), "{:.1f}"), num(pt and pt.get("gflops"), "{:.1f}"),
                     share(lo), share(pt), num(g, "{:.1f}") if g else "-", load_of(lo, pt)])
    show("train_throughput (single process, fp32, median step)",
         ["model", "threads", "unit", "loom", "pytorch", "loom/pt", "loom GF/s", "pt GF/s",
          "loom %gemm", "pt %gemm", "sgemm GF/s", "load"], rows)


def ddp_table(recs):
    rows = []
    for (model, procs, threads), impls in by_key(
            recs, "ddp_scaling", lambda r: (r["model"], r.get("procs"), r.get("threads"))).items():
        lo, pt = impls.get("loom"), impls.get("pytorch")
        unit = (lo or pt).get("unit", "")
        hidden = lo.get("hidden_share") if lo else None
        rows.append([model, f"{procs}x{threads}", unit, human(lo and lo["throughput"]),
                     human(pt and pt["throughput"]), ratio(lo and lo["throughput"], pt and pt["throughput"]),
                     num(lo and lo.get("scaling_efficiency")), num(pt and pt.get("scaling_efficiency")),
                     f"{100 * hidden:.0f}%" if hidden is not None else "-", load_of(lo, pt)])
    show("ddp_scaling (procs x threads; efficiency = P-proc throughput / (P x 1-proc))",
         ["model", "config", "unit", "loom", "pytorch", "loom/pt", "loom eff", "pt eff",
          "loom hidden", "load"], rows)


def recovery_table(recs):
    rows = []
    for impl in dict.fromkeys(r.get("impl") for r in recs if r.get("bench") == "recovery"):
        runs = [r for r in recs if r.get("bench") == "recovery" and r.get("impl") == impl
                and not r.get("summary") and r.get("recovery_s") is not None]
        if not runs:
            continue
        rs = sorted(r["recovery_s"] for r in runs)
        med = rs[len(rs) // 2] if len(rs) % 2 else (rs[len(rs) // 2 - 1] + rs[len(rs) // 2]) / 2
        last = runs[-1]
        summ = [r for r in recs if r.get("bench") == "recovery" and r.get("impl") == impl and r.get("summary")]
        # median parts when the runs came with a summary line, else the last run's
        src = summ[-1].get("parts_median") if summ else last.get("parts")
        parts = ", ".join(f"{k[:-2] if k.endswith('_s') else k} {v:.2f}"
                          for k, v in (src or {}).items() if v is not None)
        rows.append([impl, last.get("launcher", "-"), len(rs), f"{med:.3f}", f"{rs[0]:.3f}", f"{rs[-1]:.3f}",
                     load_of(last), parts])
    show("recovery (seconds from the kill to the first completed step after the restart; median parts)",
         ["impl", "launcher", "runs", "median s", "min s", "max s", "load", "parts (s)"], rows)


def accuracy_table(recs):
    rows = []
    for (model,), impls in by_key([r for r in recs if r.get("final")], "train_accuracy",
                                  lambda r: (r["model"],)).items():
        for impl, r in impls.items():
            metric = (f"test acc {100 * r['test_acc']:.2f}% after {r['epoch']} epochs" if "test_acc" in r
                      else f"val loss {r['val_loss']:.4f} at step {r['step']}")
            rows.append([model, impl, metric, f"{r.get('elapsed_s', 0):.0f}", r.get("threads", "-")])
    show("train_accuracy (real data)", ["model", "impl", "result", "seconds", "threads"], rows)


def headlines(recs, peer):
    """The headline lines: one per (model, threads) of train_throughput, two per
    (model, procs > 1) of ddp_scaling (throughput, scaling efficiency)."""
    def name(pt, what):
        return f"PyTorch {pt.get('version', '')}{what}" if pt else (peer or "PyTorch: no result")

    def fig(r, key, scale=1.0):
        return f"{scale * r[key]:.0f}" if r and r.get(key) is not None else "-"

    lines = []
    for (model, threads), impls in by_key(recs, "train_throughput",
                                          lambda r: (r["model"], r.get("threads"))).items():
        lo, pt = impls.get("loom"), impls.get("pytorch")
        unit = (lo or pt).get("unit", "")
        lines.append([f"{model}, 1 process x {threads} thread{'s' if threads != 1 else ''}",
                      unit, fig(lo, "throughput"), fig(pt, "throughput"), name(pt, "")])
    for (model, procs, threads), impls in by_key(
            recs, "ddp_scaling", lambda r: (r["model"], r.get("procs"), r.get("threads"))).items():
        if not procs or procs < 2:
            continue
        lo, pt = impls.get("loom"), impls.get("pytorch")
        unit = (lo or pt).get("unit", "")
        cfg = f"{procs} ranks x {threads} thread{'s' if threads != 1 else ''}"
        lines.append([f"{model} DDP, {cfg}", unit, fig(lo, "throughput"),
                      fig(pt, "throughput"), name(pt, " DDP (gloo)")])
        lines.append([f"{model} DDP scaling efficiency, {procs}x{threads} vs 1x{threads}", "%",
                      fig(lo, "scaling_efficiency", 100), fig(pt, "scaling_efficiency", 100),
                      name(pt, " DDP (gloo)")])
    return lines


def main():
    args = sys.argv[1:]
    out = peer = None
    while args and args[0] in ("--headlines", "--peer"):
        if len(args) < 2:
            print(f"table.py: {args[0]} needs a value", file=sys.stderr)
            return 2
        if args[0] == "--headlines":
            out = args[1]
        else:
            peer = args[1]
        args = args[2:]
    recs = load(args)
    if not recs:
        print("table.py: no result lines", file=sys.stderr)
        return 1
    throughput_table(recs)
    ddp_table(recs)
    recovery_table(recs)
    accuracy_table(recs)
    if out:
        with open(out, "a") as f:
            for line in headlines(recs, peer):
                f.write("\t".join(str(x) for x in line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
