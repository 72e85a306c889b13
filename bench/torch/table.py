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


def by_rounds(recs, bench, key):
    """{key: {impl: [records, one a round]}} keeping first-seen key order."""
    out = {}
    for r in recs:
        if r.get("bench") == bench and not r.get("summary"):
            out.setdefault(key(r), {}).setdefault(r.get("impl", "?"), []).append(r)
    return out


def median_rec(rs, field="throughput"):
    """The record of the median round (the lower middle of an even count)."""
    if not rs:
        return None
    rs = sorted(rs, key=lambda r: r.get(field) or 0)
    return rs[(len(rs) - 1) // 2]


def round_ratio(los, pts, field="throughput"):
    """loom / PyTorch: the median of the ratios of the rounds, each loom
    round against the PyTorch run beside it (same "round" field), so that a
    slow minute of a shared machine falls on both sides of a ratio; without
    round numbers, the ratio of the medians."""
    pt_by = {r.get("round"): r for r in pts or []}
    rs = sorted(lo[field] / pt_by[lo.get("round")][field] for lo in los or []
                if lo.get("round") is not None and lo.get(field)
                and pt_by.get(lo.get("round"), {}).get(field))
    if rs:
        m = len(rs)
        med = rs[m // 2] if m % 2 else (rs[m // 2 - 1] + rs[m // 2]) / 2
        return f"{med:.2f}x" + (f" ({rs[0]:.2f}-{rs[-1]:.2f})" if m > 1 else "")
    lo, pt = median_rec(los), median_rec(pts)
    return ratio(lo and lo.get(field), pt and pt.get(field))


def rss_of(rs):
    v = [r["peak_rss_mb"] for r in rs or [] if r.get("peak_rss_mb")]
    return f"{max(v):.0f}" if v else "-"


def throughput_table(recs):
    # sgemm GFLOP/s per thread count, from loom's `bench gemm` lines if present
    gemm = {}
    for r in recs:
        if r.get("bench") == "gemm" and r.get("gflops"):
            t = r.get("threads", 1)
            gemm[t] = max(gemm.get(t, 0), r["gflops"])
    groups = by_rounds(recs, "train_throughput",
                       lambda r: (r["model"], r.get("threads"), r.get("precision", "f32")))
    rows = []
    for (model, threads, prec), impls in groups.items():
        los, pts = impls.get("loom"), impls.get("pytorch")
        lo, pt = median_rec(los), median_rec(pts)
        g = gemm.get(threads)
        share = lambda r: f"{100 * r['gflops'] / g:.0f}%" if r and r.get("gflops") and g else "-"
        unit = (lo or pt).get("unit", "")

        def own(impl, r, field="throughput"):
            # step time over the same side's f32 step time (bf16 rows)
            if prec == "f32" or not r:
                return "-"
            f = median_rec(groups.get((model, threads, "f32"), {}).get(impl), field)
            r = median_rec(impls.get(impl), field)
            return f"{f[field] / r[field]:.2f}" if f and f.get(field) and r.get(field) else "-"

        n = max(len(los or []), len(pts or []))
        rows.append([model, prec, threads, unit, human(lo and lo["throughput"]),
                     human(pt and pt["throughput"]), round_ratio(los, pts),
                     round_ratio(los, pts, "items_per_cpu_s"),
                     own("loom", lo), own("pytorch", pt),
                     own("loom", lo, "items_per_cpu_s"), own("pytorch", pt, "items_per_cpu_s"),
                     num(lo and lo.get("gflops"), "{:.1f}"), num(pt and pt.get("gflops"), "{:.1f}"),
                     share(lo), share(pt), rss_of(los), rss_of(pts),
                     num(g, "{:.1f}") if g else "-", n, load_of(lo, pt)])
    show("train_throughput (single process, median step of the median round; loom/pt: median of the "
         "rounds' ratios (range); cpu: the same from items per CPU-second of the process, which other "
         "jobs on the machine inflate less; t/f32: step time over the same side's f32; RSS: peak MB "
         "of the process)",
         ["model", "prec", "threads", "unit", "loom", "pytorch", "loom/pt", "loom/pt cpu",
          "loom t/f32", "pt t/f32", "loom cpu t/f32", "pt cpu t/f32",
          "loom GF/s", "pt GF/s", "loom %gemm", "pt %gemm", "loom RSS", "pt RSS", "sgemm GF/s",
          "rounds", "load"], rows)


def ddp_table(recs):
    rows = []
    for (model, procs, threads, prec), impls in by_key(
            recs, "ddp_scaling",
            lambda r: (r["model"], r.get("procs"), r.get("threads"), r.get("precision", "f32"))).items():
        lo, pt = impls.get("loom"), impls.get("pytorch")
        unit = (lo or pt).get("unit", "")
        # one rank reduces nothing: no share of reduction to hide ("-", not 100%)
        hidden = lo.get("hidden_share") if lo and (procs or 1) > 1 else None
        rows.append([model, prec, f"{procs}x{threads}", unit, human(lo and lo["throughput"]),
                     human(pt and pt["throughput"]), ratio(lo and lo["throughput"], pt and pt["throughput"]),
                     num(lo and lo.get("scaling_efficiency")), num(pt and pt.get("scaling_efficiency")),
                     f"{100 * hidden:.0f}%" if hidden is not None else "-", load_of(lo, pt)])
    show("ddp_scaling (procs x threads; efficiency = P-proc throughput / (P x 1-proc))",
         ["model", "prec", "config", "unit", "loom", "pytorch", "loom/pt", "loom eff", "pt eff",
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
    for (model, threads, prec), impls in by_rounds(
            recs, "train_throughput",
            lambda r: (r["model"], r.get("threads"), r.get("precision", "f32"))).items():
        lo, pt = median_rec(impls.get("loom")), median_rec(impls.get("pytorch"))
        unit = (lo or pt).get("unit", "")
        what = "" if prec == "f32" else f", {prec} (PyTorch: autocast)"
        lines.append([f"{model}, 1 process x {threads} thread{'s' if threads != 1 else ''}{what}",
                      unit, fig(lo, "throughput"), fig(pt, "throughput"), name(pt, "")])
    for (model, procs, threads, prec), impls in by_key(
            recs, "ddp_scaling",
            lambda r: (r["model"], r.get("procs"), r.get("threads"), r.get("precision", "f32"))).items():
        if not procs or procs < 2:
            continue
        lo, pt = impls.get("loom"), impls.get("pytorch")
        unit = (lo or pt).get("unit", "")
        cfg = f"{procs} ranks x {threads} thread{'s' if threads != 1 else ''}"
        if prec != "f32":
            cfg += f", {prec}"
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
