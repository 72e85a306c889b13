"""PyTorch side of bench/zero: a byte-level GPT trained with DDP or FSDP2
(fully_shard, FULL_SHARD or SHARD_GRAD_OP) over gloo on CPU, P processes x 1
thread; prints one JSON line: tokens/s (median step) and the peak RSS of
each rank. With --worker, one process of a job started by someone else
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment: bench/cluster
starts them on emulated hosts); rank 0 prints the line, the slowest rank's
step."""

import argparse
import json
import os
import queue
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--strategy", default="fsdp", choices=["ddp", "fsdp", "fsdp_grad_op"])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--worker", action="store_true")
    return p.parse_args()


def worker(rank, args, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    q.put(train(rank, args))
    dist.barrier()


def env_worker(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    r = train(rank, args)
    t = torch.tensor([r["step_s"], r["rss_mb"]], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        step = float(t[0])
        print(json.dumps({"impl": "pytorch", "strategy": args.strategy, "ranks": world,
                          "params": r["params"], "step_s": step,
                          "tokens_per_s": args.batch * args.context * world / step,
                          "rss_mb": float(t[1])}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def train(rank, args):
    torch.manual_seed(1337)
    model = workloads.GPT(V=256, T=args.context, L=args.layers, C=args.d_model, NH=args.heads)
    nparams = sum(p.numel() for p in model.parameters())
    if args.strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        reshard = args.strategy == "fsdp"  # FULL_SHARD; False: SHARD_GRAD_OP
        for blk in model.blocks:
            fully_shard(blk, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 256, (args.batch, args.context), generator=g)
    y = torch.randint(0, 256, (args.batch, args.context), generator=g)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, 256), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    # first step warms up
    step = statistics.median(times[1:] if len(times) > 1 else times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"rank": rank, "step_s": step, "rss_mb": rss, "params": nparams}


def main():
    args = parse()
    if args.worker:
        env_worker(args)
        return
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, q)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    # A rank that dies (the kernel's OOM killer, for the largest model that
    # fits) never reports: fail instead of waiting for it.
    res = []
    while len(res) < len(procs):
        try:
            res.append(q.get(timeout=5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                sys.exit(f"a rank died (exit code {dead[0]})")
    for p in procs:
        p.join()
    step = max(r["step_s"] for r in res)
    print(json.dumps({"impl": "pytorch", "strategy": args.strategy, "ranks": args.ranks,
                      "params": res[0]["params"], "step_s": step,
                      "tokens_per_s": args.batch * args.context * args.ranks / step,
                      "rss_mb": max(r["rss_mb"] for r in res)}))


if __name__ == "__main__":
    main()
