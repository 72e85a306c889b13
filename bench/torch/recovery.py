#!/usr/bin/python3
"""PyTorch side of bench/recovery: torchrun --max_restarts restarting a 2-worker kjv-gpt DDP job after a SIGKILL.

Modes:
  launch  runs torchrun (timestamping its agent log), then prints the report
  worker  the training script torchrun starts (checkpoints, the kill, timestamps)
  report  reads a run directory left by `launch` and prints the report again
"""

import time

T_PY = time.time()  # first line of Python run in this process (before any import)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402

import peerenv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["launch", "worker", "report"])
    p.add_argument("--run-dir", help="events, checkpoints and logs (launch: default a new temporary dir)")
    p.add_argument("--keep", action="store_true",
                   help="launch: keep the run dir (default: a temporary one, removed after a good run)")
    p.add_argument("--nproc", type=int, default=2, help="workers (default 2)")
    p.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    p.add_argument("--steps", type=int, default=12, help="training steps in all (default 12)")
    p.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every K steps (default 5)")
    p.add_argument("--kill-step", type=int, default=8,
                   help="the worker kills itself when about to run this step, first attempt only "
                        "(default 8: between the checkpoints at 5 and 10)")
    p.add_argument("--kill-rank", type=int, default=1, help="which worker kills itself (default 1)")
    p.add_argument("--batch", type=int, default=32, help="windows of 128 bytes per worker per step")
    p.add_argument("--text", help="KJV text (default: random bytes, the same for every attempt)")
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--monitor-interval", type=float, default=1.0)
    p.add_argument("--rdzv", choices=["static", "c10d"], default="static",
                   help="torchrun rendezvous: static (torchrun's default, --master_addr/--master_port on a "
                        "free local port; the faster one, default) or c10d (what --standalone does)")
    p.add_argument("--repeat", type=int, default=1,
                   help="launch: run the scenario N times, then print a summary line (median, min, max)")
    p.add_argument("--timeout", type=float, default=300, help="launch: seconds before torchrun is killed")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


# ---------------------------------------------------------------- worker


class Events:
    """Appends one JSON object per event to RUN/events.jsonl (O_APPEND: ranks share the file)."""

    def __init__(self, run_dir, rank, attempt):
        self.path = os.path.join(run_dir, "events.jsonl")
        self.base = {"rank": rank, "attempt": attempt, "pid": os.getpid()}

    def __call__(self, ev, t=None, **kw):
        rec = {"ev": ev, "t": time.time() if t is None else t, **self.base, **kw}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def worker(args):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ev = Events(args.run_dir, rank, attempt)
    ev("proc_start", peerenv.process_start_time())
    ev("python_start", T_PY)

    peerenv.pin_threads(args.threads)
    import torch
    import torch.distributed as dist
    import workloads
    torch.set_num_threads(args.threads)
    ev("imports_done")

    dist.init_process_group("gloo", init_method="env://")
    ev("pg_done")

    T = workloads.GPT_T
    if args.text:
        text = workloads.kjv_text(args.text)
        text = text[:len(text) - len(text) // 10]
    else:
        text = torch.randint(0, 256, (1 << 20,), generator=torch.Generator().manual_seed(args.seed),
                             dtype=torch.uint8)
    offs = torch.arange(T + 1)
    ev("data_done")

    torch.manual_seed(args.seed)
    model = workloads.build_model("kjv-gpt")
    opt = workloads.build_optimizer("kjv-gpt", model)
    ckpt_dir = os.path.join(args.run_dir, "ckpt")
    latest = os.path.join(ckpt_dir, "latest.pt")
    start = 0
    if os.path.exists(latest):
        state = torch.load(latest)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
    ev("ckpt_loaded", step=start)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ev("ddp_done")

    first = True
    for step in range(start + 1, args.steps + 1):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step:
            t = time.time()
            with open(os.path.join(args.run_dir, "kill_time"), "w") as f:
                f.write(f"{t:.6f}\n")
            ev("kill", t, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        # the batch depends on (seed, step, rank) only, so a resumed run sees the same data
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
        ix = torch.randint(0, len(text) - T - 1, (args.batch,), generator=g)
        w = text[ix[:, None] + offs].long()
        loss = workloads.train_step("kjv-gpt", ddp, opt, w[:, :-1], w[:, 1:])
        if first:
            ev("first_step", step=step, loss=round(loss.item(), 5))
            first = False
        if step % args.ckpt_every == 0:
            t0 = time.time()
            if rank == 0:
                os.makedirs(ckpt_dir, exist_ok=True)
                tmp = latest + ".tmp"
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, latest)  # the previous checkpoint stays valid until this point
            dist.barrier()
            ev("ckpt_saved", step=step, save_s=round(time.time() - t0, 4))
    ev("done", step=args.steps, loss=round(loss.item(), 5))
    dist.barrier()
    os._exit(0)  # no gloo teardown (seen to hang at exit on a loaded machine)


# ---------------------------------------------------------------- launcher


AGENT_MARKS = {  # torchrun agent log lines (LOGLEVEL=INFO) -> event name
    "closing signal": "agent_sigterm",   # monitor saw a dead worker, terminates the others
    "failed (exitcode": "agent_exitcode",
    "Worker group FAILED": "agent_failed",
    "Stopping worker group": "agent_stopping",
    "Rendezvous'ing worker group": "agent_rendezvous",
    "Starting worker group": "agent_starting",
}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_once(args, run_dir):
    """One torchrun job in run_dir; its report record, or None."""
    os.makedirs(run_dir, exist_ok=True)
    for stale in ("events.jsonl", "agent.log", "kill_time"):
        if os.path.exists(os.path.join(run_dir, stale)):
            os.remove(os.path.join(run_dir, stale))
    shutil.rmtree(os.path.join(run_dir, "ckpt"), ignore_errors=True)
    log_dir = os.path.join(run_dir, "torchrun-logs")
    shutil.rmtree(log_dir, ignore_errors=True)
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    cmd = torchrun + ["--nnodes", "1", "--nproc_per_node", str(args.nproc),
                      "--max_restarts", str(args.max_restarts),
                      "--monitor_interval", str(args.monitor_interval),
                      # torchrun on Python 3.11 crashes without explicit redirects and a log dir
                      "-r", "1", "-t", "1", "--log_dir", log_dir]
    if args.rdzv == "c10d":
        cmd += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                "--rdzv_id", f"recovery-{os.getpid()}"]
    else:
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    cmd += [os.path.abspath(__file__), "worker", "--run-dir", run_dir,
            "--threads", str(args.threads), "--steps", str(args.steps),
            "--ckpt-every", str(args.ckpt_every), "--kill-step", str(args.kill_step),
            "--kill-rank", str(args.kill_rank), "--batch", str(args.batch), "--seed", str(args.seed)]
    if args.text:
        cmd += ["--text", args.text]
    env = dict(os.environ, LOGLEVEL="INFO", PYTHONUNBUFFERED="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump(vars(args), f)
    peerenv.note("$", " ".join(cmd))
    load0 = peerenv.loadavg()
    t_launch = time.time()
    # own session: on timeout the agent and its workers go down together
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    timer_killed = []

    def on_timeout():
        timer_killed.append(True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(args.timeout, on_timeout)
    timer.start()
    with open(os.path.join(run_dir, "agent.log"), "w") as log:
        for raw in proc.stderr:  # stamp each agent line as it arrives
            t = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            log.write(f"{t:.6f} {line}\n")
            log.flush()
    rc = proc.wait()
    timer.cancel()
    if timer_killed:
        peerenv.note(f"torchrun killed after {args.timeout} s")
    elif rc != 0:
        peerenv.note(f"torchrun exit code {rc}: see {run_dir}/agent.log and {log_dir}")
    return report(args, run_dir, rc, t_launch, load0)


def launch(args):
    peerenv.pin_threads(args.threads)  # workers inherit it; torchrun would force 1 otherwise
    if args.run_dir:  # launch_once removes names inside it
        peerenv.own_dir(args.run_dir, "bench/torch/recovery.py")
    recs = []
    for i in range(args.repeat):
        run_dir = args.run_dir or tempfile.mkdtemp(prefix="torch-recovery-")
        if args.repeat > 1 and args.run_dir:
            run_dir = os.path.join(args.run_dir, f"run{i}")
        peerenv.note("run dir", run_dir)
        rec = launch_once(args, run_dir)
        if rec is not None and rec["finished"] and not args.keep and not args.run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            peerenv.note("kept", run_dir)
        if rec is None or not rec["finished"]:
            return 1
        recs.append(rec)
    if len(recs) > 1:
        rs = sorted(r["recovery_s"] for r in recs)
        summary = {k: recs[0][k] for k in ("bench", "impl", "version", "model", "launcher", "rdzv",
                                           "procs", "threads", "monitor_interval_s")}
        summary.update({"summary": True, "runs": len(rs), "recovery_s": round(statistics.median(rs), 4),
                        "recovery_s_min": rs[0], "recovery_s_max": rs[-1],
                        "parts_median": {k: round(statistics.median(r["parts"][k] for r in recs), 4)
                                         for k in recs[0]["parts"]
                                         if all(r["parts"][k] is not None for r in recs)}})
        peerenv.emit(summary)
        peerenv.note(f"torchrun recovery over {len(rs)} runs: median {summary['recovery_s']:.3f} s, "
                     f"min {rs[0]:.3f}, max {rs[-1]:.3f}")
    return 0


# ---------------------------------------------------------------- report


def read_events(run_dir):
    evs = []
    path = os.path.join(run_dir, "events.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    evs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    alog = os.path.join(run_dir, "agent.log")
    if os.path.exists(alog):
        with open(alog) as f:
            for line in f:
                t, _, text = line.partition(" ")
                for mark, name in AGENT_MARKS.items():
                    if mark in text:
                        evs.append({"ev": name, "t": float(t), "rank": None, "attempt": None})
    return evs


def report(args, run_dir, rc=None, t_launch=None, load0=None):
    import torch  # for the version only; the launcher process trains nothing
    evs = read_events(run_dir)
    kill = [e for e in evs if e["ev"] == "kill"]
    if not kill:
        peerenv.note("no kill event: the run did not reach the kill step (see", run_dir, ")")
        return None
    tk = kill[0]["t"]

    def after(name, attempt=None, agg=max):
        ts = [e["t"] for e in evs if e["ev"] == name and e["t"] is not None and e["t"] >= tk
              and (attempt is None or e["attempt"] == attempt)]
        return agg(ts) if ts else None

    # the restarted group: attempt 1 on every rank; a step completes when all ranks complete it
    detect = after("agent_sigterm", agg=min) or after("agent_exitcode", agg=min)
    marks = [
        ("detect", detect),                                # monitor loop sees the dead worker
        ("stop", after("agent_rendezvous", agg=min)),      # survivors SIGTERMed and reaped
        ("rendezvous", after("agent_starting", agg=min)),  # agent's rendezvous for the new group
        ("spawn", after("python_start", 1)),               # fork/exec + interpreter to the script's 1st line
        ("imports", after("imports_done", 1)),             # import torch etc.
        ("process_group", after("pg_done", 1)),            # init_process_group (gloo)
        ("data", after("data_done", 1)),
        ("checkpoint_load", after("ckpt_loaded", 1)),      # model + optimizer built and loaded
        ("ddp_wrap", after("ddp_done", 1)),                # DDP constructor (broadcast from rank 0)
        ("first_step", after("first_step", 1)),            # first training step completed
    ]
    parts, prev = {}, tk
    for name, t in marks:
        if t is None:
            parts[name + "_s"] = None
            continue
        parts[name + "_s"] = round(t - prev, 4)
        prev = t
    t_first = after("first_step", 1)
    resumed = [e for e in evs if e["ev"] == "ckpt_loaded" and e["attempt"] == 1]
    done = [e for e in evs if e["ev"] == "done"]
    spawned = after("proc_start", 1)
    t_start = after("agent_starting", agg=min)
    rec = {"bench": "recovery", **peerenv.peer_info(torch), "model": "kjv-gpt",
           "launcher": "torchrun", "rdzv": args.rdzv, "procs": args.nproc, "threads": args.threads,
           "max_restarts": args.max_restarts, "monitor_interval_s": args.monitor_interval,
           "steps": args.steps, "ckpt_every": args.ckpt_every, "kill_step": args.kill_step,
           "kill_rank": args.kill_rank,
           "resumed_from_step": resumed[0].get("step") if resumed else None,
           "recovery_s": round(t_first - tk, 4) if t_first else None,
           "parts": parts,
           # /proc start time of the last new worker (10 ms ticks) after "Starting worker group"
           "process_created_s": round(spawned - t_start, 4) if spawned and t_start else None,
           "finished": bool(done) and rc in (0, None), "torchrun_rc": rc,
           "job_s": round(max(e["t"] for e in evs) - t_launch, 3) if t_launch else None,
           "loadavg_start": load0, "loadavg_end": peerenv.loadavg()}
    peerenv.emit(rec)
    if rec["recovery_s"] is not None:
        peerenv.note(f"torchrun recovery {rec['recovery_s']:.3f} s from kill to first step after restart: "
                     + ", ".join(f"{k[:-2]} {v:.3f}" for k, v in parts.items() if v is not None)
                     + f"; load {load0}")
    return rec if rec["recovery_s"] is not None else None


def main():
    args = parse()
    if args.mode == "worker":
        worker(args)
    elif args.mode == "launch":
        sys.exit(launch(args))
    else:
        if not args.run_dir:
            raise SystemExit("report needs --run-dir")
        saved = os.path.join(args.run_dir, "args.json")
        if os.path.exists(saved):  # the settings the run was launched with
            with open(saved) as f:
                vars(args).update({k: v for k, v in json.load(f).items() if k not in ("mode", "run_dir")})
        sys.exit(0 if report(args, args.run_dir) is not None else 1)


if __name__ == "__main__":
    main()
