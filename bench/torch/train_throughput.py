#!/usr/bin/python3
"""PyTorch side of bench/train_throughput: single-process training throughput of the reference workloads, f32 or bf16 autocast."""

import argparse
import os
import resource
import subprocess
import sys
import time

import peerenv

DEFAULT_STEPS = {"fashion-mlp": 100, "fashion-cnn": 40, "kjv-gpt": 20}
DEFAULT_WARMUP = {"fashion-mlp": 10, "fashion-cnn": 5, "kjv-gpt": 3}


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="all",
                   help="fashion-mlp, fashion-cnn, kjv-gpt, a comma list, or all (default)")
    p.add_argument("--threads", default="1",
                   help="threads per process, or a comma list (each in its own process); default 1")
    p.add_argument("--steps", type=int, help="timed steps (default per model: mlp 100, cnn 40, gpt 20)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default mlp 10, cnn 5, gpt 3)")
    p.add_argument("--batch", type=int,
                   help="samples (GPT: windows of 128 bytes) per step; default 128 / 32")
    p.add_argument("--text", help="KJV text file for the GPT (default: random bytes; "
                   "throughput does not depend on the text)")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16"],
                   help="f32 (default) or bf16: torch.autocast(\"cpu\", torch.bfloat16) around forward and loss")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def models_of(arg):
    names = ["fashion-mlp", "fashion-cnn", "kjv-gpt"] if arg == "all" else arg.split(",")
    for n in names:
        if n not in DEFAULT_STEPS:
            raise SystemExit(f"unknown model {n!r}: fashion-mlp, fashion-cnn, kjv-gpt or all")
    return names


def measure(name, args, torch, workloads):
    torch.manual_seed(args.seed)
    model = workloads.build_model(name)
    model.train()
    opt = workloads.build_optimizer(name, model)
    batch = args.batch or workloads.default_batch(name)
    text = workloads.kjv_text(args.text) if (name == "kjv-gpt" and args.text) else None
    batches = workloads.synthetic_batches(name, batch, text=text, seed=args.seed)
    steps = args.steps or DEFAULT_STEPS[name]
    warmup = DEFAULT_WARMUP[name] if args.warmup is None else args.warmup
    load0 = peerenv.loadavg()

    times, cpu = [], []
    for i in range(warmup + steps):
        x, y = batches[i % len(batches)]
        c0, t0 = time.process_time(), time.perf_counter()
        loss = workloads.train_step(name, model, opt, x, y, args.precision)
        t1, c1 = time.perf_counter(), time.process_time()
        if i >= warmup:
            times.append(t1 - t0)
            cpu.append(c1 - c0)
    if not torch.isfinite(loss):
        raise SystemExit(f"{name}: loss is {loss.item()}")

    st = peerenv.summarize(times)
    items = workloads.items_per_batch(name, batch)
    fl = workloads.train_flops(name)
    tput = items / st["median_s"]
    rec = {"bench": "train_throughput", **peerenv.peer_info(torch),
           "model": name, "precision": args.precision, "procs": 1, "threads": torch.get_num_threads(), "batch": batch,
           "items_per_step": items, "unit": workloads.unit(name),
           "throughput": round(tput, 1),
           "throughput_mean": round(items / st["mean_s"], 1),
           # items per CPU-second of this process (all its threads): with 1
           # thread, close to the unloaded throughput when others share the cores
           "items_per_cpu_s": round(items / peerenv.summarize(cpu)["median_s"], 1),
           "step_median_s": round(st["median_s"], 6), "step_p10_s": round(st["p10_s"], 6),
           "step_p90_s": round(st["p90_s"], 6), "steps": steps, "warmup": warmup,
           "train_flops_per_item": fl["train_flops"], "flops_per": fl["flops_per"],
           "gflops": round(tput * fl["train_flops"] / 1e9, 2),
           "params": workloads.PARAM_COUNT[name],
           "data": "text" if text is not None else "synthetic",
           # this process's peak so far (one model a process: the model's)
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "loadavg_start": load0, "loadavg_end": peerenv.loadavg()}
    peerenv.emit(rec)
    peerenv.note(f"{name} {args.precision} threads={rec['threads']} batch={batch}: {tput:,.0f} {rec['unit']} "
                 f"(median step {st['median_s'] * 1e3:.2f} ms, p10 {st['p10_s'] * 1e3:.2f}, "
                 f"p90 {st['p90_s'] * 1e3:.2f}; {rec['gflops']} GFLOP/s; load {load0})")


def main():
    args = parse()
    threads = [int(t) for t in args.threads.split(",")]
    names = models_of(args.model)
    if len(threads) > 1:
        # thread pools are sized when torch loads: one process per thread count
        rc = 0
        for t in threads:
            cmd = [sys.executable, os.path.abspath(__file__)] + \
                  [a for a in sys.argv[1:]] + ["--threads", str(t)]
            rc |= subprocess.call(cmd)
        sys.exit(rc)

    peerenv.pin_threads(threads[0])
    import torch
    import workloads
    torch.set_num_threads(threads[0])
    torch.set_num_interop_threads(1)
    for name in names:
        measure(name, args, torch, workloads)


if __name__ == "__main__":
    main()
