"""PyTorch side of bench/model_parallel: workloads.py's byte-level GPT trained
over gloo on CPU, P processes x 1 thread, with one of
  ddp    DistributedDataParallel, the global batch split over the ranks;
  gpipe  torch.distributed.pipelining, ScheduleGPipe, M micro-batches;
  1f1b   the same with Schedule1F1B;
  tp     torch.distributed.tensor.parallel: in each block the attention's
         q, k, v ColwiseParallel and its output projection RowwiseParallel,
         the MLP's fc ColwiseParallel and fcproj RowwiseParallel (Megatron's
         split: heads and hidden units over the ranks); embeddings, layer
         norms and the output layer replicated.
Prints one JSON line: tokens/s (median over steps 2.. of the slowest rank's
step), the peak RSS of each rank, or the first line of the error when the
strategy does not run here ("error"), exit status 0 either way.

Same global batch in every strategy (--batch rows of --context tokens a
step): DDP gives each rank batch / P rows; a pipeline takes all of it in M
micro-batches; tensor parallelism gives every rank all of it. The pipeline's
stages split the blocks evenly, stage 0 holding the embeddings and the last
the final LayerNorm and the output layer; the output layer is untied there
(a stage's parameters are its own in torch.distributed.pipelining), which
saves PyTorch the exchange of the tied weight's gradient that loom makes.
For tensor parallelism q, k and v are three linear layers (the fused qkv of
workloads.GPT, split by rows, would hand a rank parts of q and of k, not
whole heads): the same parameters and FLOPs.
"""

import argparse
import json
import os
import queue
import resource
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

STRATEGIES = ("ddp", "gpipe", "1f1b", "tp")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", required=True, choices=STRATEGIES)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=4, help="M, pipelines only")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32, help="rows of the global batch")
    p.add_argument("--steps", type=int, default=5, help="steps; the first is not timed")
    p.add_argument("--port", type=int, default=29541)
    p.add_argument("--timeout", type=float, default=900)
    return p.parse_args()


# ---------------------------------------------------------------- models


class TPAttention(nn.Module):
    """workloads.CausalSelfAttention with q, k, v apart; under tensor
    parallelism each rank holds whole heads, and the head count follows from
    the local width."""

    def __init__(self, C, NH, T):
        super().__init__()
        self.hs = C // NH
        self.q, self.k, self.v = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.proj = nn.Linear(C, C)
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)        # (B, T, C / P) each
        nh = q.size(-1) // self.hs                        # heads of this rank
        q, k, v = (t.view(B, T, nh, self.hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (self.hs ** -0.5)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v                    # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, nh * self.hs))


def build_gpt(args, tp=False):
    torch.manual_seed(1337)
    m = workloads.GPT(V=256, T=args.context, L=args.layers, C=args.d_model, NH=args.heads)
    if tp:
        for blk in m.blocks:
            blk.attn = TPAttention(args.d_model, args.heads, args.context)
            for lin in (blk.attn.q, blk.attn.k, blk.attn.v, blk.attn.proj):
                nn.init.normal_(lin.weight, 0.0, 0.02)
                nn.init.zeros_(lin.bias)
    return m


class Stage(nn.Module):
    """Blocks [lo, hi) of the GPT, with the embeddings on the first stage and
    the final LayerNorm and an (untied) output layer on the last."""

    def __init__(self, gpt, lo, hi, first, last):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe = gpt.wte, gpt.wpe
        self.blocks = nn.ModuleList(gpt.blocks[lo:hi])
        if last:
            self.lnf = gpt.lnf
            self.head = nn.Linear(gpt.wte.weight.size(1), gpt.wte.weight.size(0), bias=False)
            with torch.no_grad():
                self.head.weight.copy_(gpt.wte.weight)

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.size(1)))
        for b in self.blocks:
            x = b(x)
        if self.last:
            x = self.head(self.lnf(x))
        return x


def xent(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


# ---------------------------------------------------------------- training


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def train(rank, args):
    P, B, T = args.ranks, args.batch, args.context
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, 256, (B, T + 1), generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    full = sum(p.numel() for p in build_gpt(args).parameters())
    s = args.strategy
    if s == "ddp":
        if B % P:
            raise SystemExit(f"batch {B} is not a multiple of {P} ranks")
        rows = slice(rank * B // P, (rank + 1) * B // P)
        x, y = x[rows], y[rows]
        model = nn.parallel.DistributedDataParallel(build_gpt(args))
        opt = adamw(model.parameters())
        mine = sum(p.numel() for p in model.parameters())

        def step():
            xent(model(x), y).backward()
    elif s == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        mesh = init_device_mesh("cpu", (P,))
        model = build_gpt(args, tp=True)
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "fc": ColwiseParallel(), "fcproj": RowwiseParallel()}
        for blk in model.blocks:
            parallelize_module(blk, mesh, plan)
        opt = adamw(model.parameters())
        mine = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                   for p in model.parameters())

        def step():
            xent(model(x), y).backward()
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        M = args.micro_batches
        if B % M:
            raise SystemExit(f"batch {B} is not a multiple of {M} micro-batches")
        if args.layers < P:
            raise SystemExit(f"{args.layers} layers on {P} stages")
        gpt = build_gpt(args)
        lo, hi = rank * args.layers // P, (rank + 1) * args.layers // P
        mod = Stage(gpt, lo, hi, rank == 0, rank == P - 1)
        del gpt
        stage = PipelineStage(mod, rank, P, torch.device("cpu"))
        sched = (ScheduleGPipe if s == "gpipe" else Schedule1F1B)(stage, n_microbatches=M,
                                                                  loss_fn=xent)
        opt = adamw(mod.parameters())
        mine = sum(p.numel() for p in mod.parameters())

        def step():
            if rank == 0:
                sched.step(x)
            elif rank == P - 1:
                sched.step(target=y, losses=[])
            else:
                sched.step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"rank": rank, "times": times, "rss_mb": rss, "params": full, "params_rank": mine}


def worker(rank, args, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
        r = train(rank, args)
        # the slowest rank's time for each step
        t = torch.tensor(r["times"], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        r["times"] = t.tolist()
        q.put(r)
        dist.barrier()
        code = 0
    except BaseException as e:  # noqa: BLE001: the table shows any error
        q.put({"rank": rank, "error": f"{type(e).__name__}: {e}".split("\n")[0][:200],
               "trace": traceback.format_exc()})
        code = 1
    # the queue's feeder thread must hand the result over before os._exit
    # (which skips a gloo teardown that can hang) ends the process
    q.close()
    q.join_thread()
    sys.stderr.flush()
    os._exit(code)


def main():
    args = parse()
    base = {"bench": "model_parallel", "impl": "pytorch", "version": torch.__version__,
            "strategy": args.strategy, "ranks": args.ranks,
            "micro_batches": args.micro_batches if args.strategy in ("gpipe", "1f1b") else None,
            "layers": args.layers, "d_model": args.d_model, "context": args.context,
            "batch": args.batch}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, q)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    res, err = [], None
    deadline = time.monotonic() + args.timeout
    while len(res) < len(procs) and err is None:
        try:
            r = q.get(timeout=2)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if not dead and all(p.exitcode == 0 for p in procs):
                dead = [0]  # every rank left, one result never came
            if dead:
                # a rank the kernel killed never reports; one that raised has
                # put its error first
                try:
                    r = q.get(timeout=2)
                except queue.Empty:
                    err = f"a rank died (exit code {dead[0]})"
                    break
            elif time.monotonic() > deadline:
                err = f"timed out after {args.timeout:.0f} s"
                break
            else:
                continue
        if "error" in r:
            err = r["error"]
            print(f"[torch-peer] model_parallel {args.strategy} rank {r['rank']}:\n{r['trace']}",
                  file=sys.stderr)
        else:
            res.append(r)
    if err is not None:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join()
        print(json.dumps({**base, "error": err}), flush=True)
        return 0
    for p in procs:
        p.join()
    res.sort(key=lambda r: r["rank"])
    times = res[0]["times"]
    step = statistics.median(times[1:] if len(times) > 1 else times)
    print(json.dumps({**base, "params": res[0]["params"],
                      "params_rank": [r["params_rank"] for r in res], "step_s": round(step, 6),
                      "tokens_per_s": round(args.batch * args.context / step, 1),
                      "rss_mb_ranks": [round(r["rss_mb"], 1) for r in res]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
