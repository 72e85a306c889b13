#!/usr/bin/python3
"""PyTorch side of bench/ddp_scaling: DDP (gloo) with P processes x 1 thread vs 1 process x 1 thread, f32 or bf16 autocast."""

import argparse
import faulthandler
import json
import os
import socket
import subprocess
import sys
import time

import peerenv

DEFAULT_STEPS = {"fashion-mlp": 100, "fashion-cnn": 30, "kjv-gpt": 15}
DEFAULT_WARMUP = {"fashion-mlp": 10, "fashion-cnn": 5, "kjv-gpt": 3}


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="all", help="fashion-mlp, fashion-cnn, kjv-gpt, a comma list, or all")
    p.add_argument("--procs", type=int, default=2, help="DDP processes (default 2)")
    p.add_argument("--threads", type=int, default=1, help="threads per process (default 1)")
    p.add_argument("--steps", type=int, help="timed steps (default mlp 100, cnn 30, gpt 15)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default mlp 10, cnn 5, gpt 3)")
    p.add_argument("--batch", type=int, help="per process per step; default 128 images / 32 windows")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (PyTorch default 25)")
    p.add_argument("--nosync", action="store_true",
                   help="also time the DDP processes with reduction off (model.no_sync()): "
                        "separates core sharing from communication")
    p.add_argument("--baseline-ddp", action="store_true",
                   help="run the 1-process baseline wrapped in DDP (world 1) instead of plain training")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16"],
                   help="f32 (default) or bf16: torch.autocast(\"cpu\", torch.bfloat16) around forward and loss")
    p.add_argument("--text", help="KJV text for the GPT (default random bytes)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=600, help="seconds before a config is abandoned")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- worker


def worker(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # if this process hangs, say where before the launcher kills it
    faulthandler.dump_traceback_later(max(1.0, args.timeout - 5), exit=False)
    peerenv.pin_threads(args.threads)
    import torch
    import torch.distributed as dist
    import workloads
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    name = args.model
    use_ddp = world > 1 or args.baseline_ddp
    if use_ddp:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = workloads.build_model(name)
    if use_ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = workloads.build_optimizer(name, model)
    batch = args.batch or workloads.default_batch(name)
    text = workloads.kjv_text(args.text) if (name == "kjv-gpt" and args.text) else None
    batches = workloads.synthetic_batches(name, batch, text=text, seed=args.seed + rank)
    steps = args.steps or DEFAULT_STEPS[name]
    warmup = DEFAULT_WARMUP[name] if args.warmup is None else args.warmup

    def run(n, sync):
        times = []
        for i in range(n):
            x, y = batches[i % len(batches)]
            t0 = time.perf_counter()
            if sync or not use_ddp:
                workloads.train_step(name, model, opt, x, y, args.precision)
            else:
                with model.no_sync():
                    workloads.train_step(name, model, opt, x, y, args.precision)
            times.append(time.perf_counter() - t0)
        return times

    def slowest(times):
        # a DDP step ends for the job when its slowest rank ends it
        if not use_ddp:
            return times
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    load0 = peerenv.loadavg()
    run(warmup, True)
    if use_ddp:
        dist.barrier()
    times = slowest(run(steps, True))
    nosync = None
    if args.nosync and use_ddp:
        dist.barrier()
        nosync = slowest(run(steps, False))
    if use_ddp:
        dist.barrier()
    if rank != 0:
        # skip teardown: a gloo group being destroyed at exit was seen to hang
        # a rank for minutes on a loaded machine; nothing is left to flush
        os._exit(0)
    items = workloads.items_per_batch(name, batch) * world
    st = peerenv.summarize(times)
    rec = {"bench": "ddp_scaling", **peerenv.peer_info(torch), "model": name, "precision": args.precision,
           "procs": world, "threads": args.threads, "ddp": use_ddp,
           "backend": "gloo" if use_ddp else None, "bucket_mb": args.bucket_mb if use_ddp else None,
           "batch": batch, "items_per_step": items, "unit": workloads.unit(name),
           "throughput": round(items / st["median_s"], 1),
           "step_median_s": round(st["median_s"], 6), "step_p10_s": round(st["p10_s"], 6),
           "step_p90_s": round(st["p90_s"], 6), "steps": steps, "warmup": warmup,
           "loadavg_start": load0, "loadavg_end": peerenv.loadavg()}
    if nosync is not None:
        rec["throughput_nosync"] = round(items / peerenv.summarize(nosync)["median_s"], 1)
    peerenv.emit(rec)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------- launcher


def launch(args, name, world):
    """Start `world` worker processes (env:// rendezvous on a free port); rank 0's result."""
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", name,
           "--threads", str(args.threads), "--timeout", str(args.timeout), "--bucket-mb", str(args.bucket_mb), "--seed", str(args.seed),
           "--precision", args.precision]
    for flag in ("steps", "warmup", "batch", "text"):
        v = getattr(args, flag)
        if v is not None:
            cmd += ["--" + flag, str(v)]
    if args.nosync:
        cmd.append("--nosync")
    if args.baseline_ddp:
        cmd.append("--baseline-ddp")
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
    deadline = time.monotonic() + args.timeout
    out = b""
    straggler = False
    try:
        out = procs[0].communicate(timeout=args.timeout)[0]
        for p in procs[1:]:
            # rank 0 has the result once it exits; the others only have to leave
            p.wait(timeout=min(30.0, max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        straggler = procs[0].returncode == 0
        peerenv.note(f"{name} x{world}: " + ("a worker did not exit 30 s after rank 0; killed"
                                             if straggler else f"timed out after {args.timeout} s"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad and not straggler:
        peerenv.note(f"{name} x{world}: worker exit codes {[p.returncode for p in procs]}")
        return None
    lines = [l for l in out.decode().splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main():
    args = parse()
    if args.worker:
        worker(args)
        return
    names = ["fashion-mlp", "fashion-cnn", "kjv-gpt"] if args.model == "all" else args.model.split(",")
    for n in names:
        if n not in DEFAULT_STEPS:
            raise SystemExit(f"unknown model {n!r}: fashion-mlp, fashion-cnn, kjv-gpt or all")
    rc = 0
    for name in names:
        one = launch(args, name, 1)
        many = launch(args, name, args.procs)
        for rec in (one, many):
            if rec is None:
                rc = 1
                continue
            if one is not None and rec is many:
                rec["baseline_throughput"] = one["throughput"]
                rec["scaling_efficiency"] = round(rec["throughput"] / (args.procs * one["throughput"]), 3)
                if "throughput_nosync" in rec:
                    rec["efficiency_nosync"] = round(
                        rec["throughput_nosync"] / (args.procs * one["throughput"]), 3)
            peerenv.emit(rec)
        if one is not None and many is not None:
            peerenv.note(f"{name} {args.precision}: 1x{args.threads} {one['throughput']:,.0f}, "
                         f"{args.procs}x{args.threads} DDP {many['throughput']:,.0f} {one['unit']}, "
                         f"efficiency {many['scaling_efficiency']:.2f}"
                         + (f" (no_sync {many['efficiency_nosync']:.2f})" if "efficiency_nosync" in many else "")
                         + f"; load {many['loadavg_start']}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
