#!/usr/bin/python3
"""PyTorch reference accuracy/loss of the reference workloads trained on real data (Fashion-MNIST, KJV)."""

import argparse
import math
import time

import peerenv


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, choices=["fashion-mlp", "fashion-cnn", "kjv-gpt"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5, help="Fashion models: epochs (default 5)")
    p.add_argument("--steps", type=int, default=500, help="GPT: optimizer steps (default 500)")
    p.add_argument("--eval-every", type=int, default=100, help="GPT: validation every N steps and at the end")
    p.add_argument("--val-windows", type=int, default=0,
                   help="GPT: evaluate on the first N held-out windows (default 0 = all)")
    p.add_argument("--batch", type=int, help="per step; default 128 images / 32 windows")
    p.add_argument("--text", help="KJV plain text; default: loom's `loom data kjv` cache "
                   "($LOOM_DATA_DIR/kjv.txt or data/kjv.txt) if present, else printed by Debian's `bible`")
    p.add_argument("--data-dir", help="Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def fashion(args, torch, workloads, base):
    root = args.data_dir or workloads.FASHION_DIR
    xtr, ytr = workloads.fashion_mnist("train", root)
    xte, yte = workloads.fashion_mnist("test", root)
    name = args.model
    model = workloads.build_model(name)
    opt = workloads.build_optimizer(name, model)
    B = args.batch or 128
    g = torch.Generator().manual_seed(args.seed)
    t_start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(len(xtr), generator=g)
        tot, n = 0.0, 0
        for i in range(0, len(perm), B):  # last batch partial, as DataLoader(drop_last=False)
            idx = perm[i:i + B]
            loss = workloads.train_step(name, model, opt, xtr[idx], ytr[idx])
            tot += loss.item() * len(idx)
            n += len(idx)
        model.eval()
        correct, tl = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(xte), 1000):
                out = model(xte[i:i + 1000])
                tl += torch.nn.functional.cross_entropy(out, yte[i:i + 1000], reduction="sum").item()
                correct += (out.argmax(1) == yte[i:i + 1000]).sum().item()
        rec = {**base, "epoch": epoch, "train_loss": round(tot / n, 5),
               "test_loss": round(tl / len(xte), 5), "test_acc": round(correct / len(xte), 5),
               "elapsed_s": round(time.perf_counter() - t_start, 2),
               "final": epoch == args.epochs, "loadavg": peerenv.loadavg()}
        peerenv.emit(rec)
        peerenv.note(f"{name} epoch {epoch}: train loss {rec['train_loss']:.4f}, "
                     f"test acc {rec['test_acc'] * 100:.2f}% ({rec['elapsed_s']} s)")


def gpt(args, torch, workloads, base):
    T = workloads.GPT_T
    src = args.text or workloads.kjv_cached_path() or "bible -f -m 8192 Gen1:1-Rev22:21"
    text = workloads.kjv_text(args.text)
    base["text"] = src
    split = len(text) - len(text) // 10  # last 10% of the bytes held out
    train, val = text[:split], text[split:]
    peerenv.note(f"text from {src}: {len(text):,} bytes: train {len(train):,}, val {len(val):,}")
    # validation: non-overlapping windows of T+1 bytes at stride T, all T targets scored
    nwin = (len(val) - 1) // T
    if args.val_windows:
        nwin = min(nwin, args.val_windows)
    vstarts = torch.arange(nwin) * T
    model = workloads.build_model("kjv-gpt")
    opt = workloads.build_optimizer("kjv-gpt", model)
    B = args.batch or 32
    g = torch.Generator().manual_seed(args.seed)
    offs = torch.arange(T + 1)

    def val_loss():
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad():
            for i in range(0, nwin, 64):
                w = val[vstarts[i:i + 64, None] + offs].long()  # (b, T+1)
                tot += workloads.loss_fn("kjv-gpt", model, w[:, :-1], w[:, 1:]).item() * w.size(0)
                n += w.size(0)
        model.train()
        return tot / n

    t_start = time.perf_counter()
    run_loss = []
    for step in range(1, args.steps + 1):
        # uniform random windows of the training part
        ix = torch.randint(0, len(train) - T - 1, (B,), generator=g)
        w = train[ix[:, None] + offs].long()  # (B, T+1)
        loss = workloads.train_step("kjv-gpt", model, opt, w[:, :-1], w[:, 1:])
        run_loss.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            train_s = time.perf_counter() - t_start
            vl = val_loss()
            tl = sum(run_loss) / len(run_loss)
            run_loss = []
            rec = {**base, "step": step, "train_loss": round(tl, 5), "val_loss": round(vl, 5),
                   "val_bits_per_byte": round(vl / math.log(2), 5), "val_windows": nwin,
                   "elapsed_s": round(time.perf_counter() - t_start, 2),
                   "train_elapsed_s": round(train_s, 2),
                   "final": step == args.steps, "loadavg": peerenv.loadavg()}
            peerenv.emit(rec)
            peerenv.note(f"kjv-gpt step {step}: train loss {tl:.4f}, val loss {vl:.4f} "
                         f"({rec['elapsed_s']} s)")


def main():
    args = parse()
    peerenv.pin_threads(args.threads)
    import torch
    import workloads
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    base = {"bench": "train_accuracy", **peerenv.peer_info(torch), "model": args.model,
            "threads": args.threads, "batch": args.batch or workloads.default_batch(args.model)}
    if args.model == "kjv-gpt":
        gpt(args, torch, workloads, base)
    else:
        fashion(args, torch, workloads, base)


if __name__ == "__main__":
    main()
