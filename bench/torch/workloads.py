"""The reference workloads of DESIGN.md in PyTorch: models, optimizers, data, FLOP counts, one training step."""

import contextlib
import gzip
import os
import struct
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("fashion-mlp", "fashion-cnn", "kjv-gpt")

# Parameter counts fixed by DESIGN.md ("Reference workloads"); a model that
# does not match is not the reference model and must not be timed.
PARAM_COUNT = {"fashion-mlp": 669_706, "fashion-cnn": 62_346, "kjv-gpt": 842_496}

# GPT shape (DESIGN.md): V vocab, T context, L layers, C channels, NH heads.
GPT_V, GPT_T, GPT_L, GPT_C, GPT_NH = 256, 128, 4, 128, 4

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
FASHION_DIR = "/usr/share/datasets/fashion-mnist"


# ---------------------------------------------------------------- models


def fashion_mlp():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10),
    )


def fashion_cnn():
    # no padding: 28 -conv5-> 24 -pool-> 12 -conv5-> 8 -pool-> 4; 64*4*4 = 1024
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(1024, 10),
    )


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        # a plain attribute, not a buffer: the model holds parameters only, and
        # gloo cannot broadcast bool buffers (DDP syncs buffers at start)
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(x).split(C, dim=2)            # (B, T, C) each
        q = q.view(B, T, self.NH, hs).transpose(1, 2)   # (B, NH, T, hs)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (hs ** -0.5)  # (B, NH, T, T)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                      # (B, NH, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.ln1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, NH, T)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fcproj(self.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Byte-level GPT: pre-LN, learned positions, final LN, output tied to wte."""

    def __init__(self, V=GPT_V, T=GPT_T, L=GPT_L, C=GPT_C, NH=GPT_NH):
        super().__init__()
        self.T = T
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH, T) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        for m in self.modules():  # DESIGN.md: N(0, 0.02) weights, zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)                # (B, T, C)
        for blk in self.blocks:
            x = blk(x)
        x = self.lnf(x)
        return x @ self.wte.weight.t()                   # (B, T, V) logits


def build_model(name):
    model = {"fashion-mlp": fashion_mlp, "fashion-cnn": fashion_cnn, "kjv-gpt": GPT}[name]()
    n = sum(p.numel() for p in model.parameters())
    if n != PARAM_COUNT[name]:
        raise SystemExit(f"{name}: {n} parameters, reference is {PARAM_COUNT[name]}")
    return model


def build_optimizer(name, model):
    if name == "kjv-gpt":
        # weight decay on every parameter (plain AdamW(model.parameters()))
        return torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999),
                                 eps=1e-8, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def default_batch(name):
    """Samples per rank per step: 128 images, or 32 windows of 128 bytes."""
    return 32 if name == "kjv-gpt" else 128


def unit(name):
    return "tokens/s" if name == "kjv-gpt" else "samples/s"


def items_per_batch(name, batch):
    """What throughput counts: tokens for the GPT, images otherwise."""
    return batch * GPT_T if name == "kjv-gpt" else batch


# ---------------------------------------------------------------- FLOPs


def train_flops(name):
    """Matmul/conv FLOPs of one training step per item (image or token).

    Counted: every GEMM and convolution, 2*M*N*K forward and twice that
    backward (input gradient + weight gradient), so training = 3x forward,
    including the input gradient of the first layer that frameworks skip.
    Attention counts the full T x T score and value products (PyTorch 1.13
    on CPU computes the masked half too). Not counted: elementwise ops,
    softmax, LayerNorm, pooling, the loss, the optimizer, embeddings.
    """
    if name == "fashion-mlp":
        fwd = 2 * (784 * 512 + 512 * 512 + 512 * 10)
    elif name == "fashion-cnn":
        conv1 = 2 * (24 * 24) * 32 * (1 * 5 * 5)
        conv2 = 2 * (8 * 8) * 64 * (32 * 5 * 5)
        fwd = conv1 + conv2 + 2 * 1024 * 10
    else:
        C, T, V, L = GPT_C, GPT_T, GPT_V, GPT_L
        per_layer = 2 * C * (3 * C) + 2 * C * C + 2 * C * (4 * C) * 2  # qkv, proj, fc, fcproj
        attn = 2 * T * C * 2                                          # q k^T and att v
        fwd = L * (per_layer + attn) + 2 * C * V                      # + tied output layer
    return {"forward_flops": fwd, "train_flops": 3 * fwd,
            "flops_per": "token" if name == "kjv-gpt" else "sample"}


# ---------------------------------------------------------------- data


def synthetic_batches(name, batch, count=4, text=None, seed=0):
    """A few batches of the right shapes to cycle through while timing."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        if name == "kjv-gpt":
            if text is not None:
                ix = torch.randint(0, len(text) - GPT_T - 1, (batch,), generator=g)
                w = torch.stack([text[i:i + GPT_T + 1] for i in ix.tolist()]).long()
            else:
                w = torch.randint(0, 256, (batch, GPT_T + 1), generator=g)
            out.append((w[:, :-1].contiguous(), w[:, 1:].contiguous()))
        else:
            x = torch.randn(batch, 1, 28, 28, generator=g)
            y = torch.randint(0, 10, (batch,), generator=g)
            out.append((x, y))
    return out


def read_idx(path):
    """An IDX file (gzip or not) as a uint8 tensor of its dimensions."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8)
    return data.view(*dims)


def fashion_mnist(split, root=FASHION_DIR):
    """(images (N, 1, 28, 28) normalised float32, labels (N,) int64)."""
    prefix = "train" if split == "train" else "t10k"
    img = os.path.join(root, f"{prefix}-images-idx3-ubyte.gz")
    lab = os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz")
    if not os.path.exists(img):
        raise SystemExit(f"{img} missing: apt-get install dataset-fashion-mnist")
    x = read_idx(img).float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)
    return x.unsqueeze(1), read_idx(lab).long()


def kjv_bytes_from_bible():
    """The KJV text as Debian's bible-kjv prints it, verse references stripped."""
    try:
        out = subprocess.run(["bible", "-f", "-m", "8192", "Gen1:1-Rev22:21"],
                             check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"cannot run `bible` ({e}): apt-get install bible-kjv bible-kjv-text")
    lines = out.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return b"".join(l.split(b" ", 1)[1] + b"\n" if b" " in l else l + b"\n" for l in lines)


def kjv_cached_path():
    """loom's `loom data kjv` output if it exists: $LOOM_DATA_DIR/kjv.txt, else data/kjv.txt of the repo."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for d in (os.environ.get("LOOM_DATA_DIR"), os.path.join(root, "data")):
        if d and os.path.isfile(os.path.join(d, "kjv.txt")):
            return os.path.join(d, "kjv.txt")
    return None


def kjv_text(path=None):
    """The text as a uint8 tensor: from `path`, else loom's cached file, else printed by `bible`."""
    path = path or kjv_cached_path()
    if path:
        with open(path, "rb") as f:
            raw = f.read()
    else:
        raw = kjv_bytes_from_bible()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


# ---------------------------------------------------------------- training


def loss_fn(name, model, x, y):
    out = model(x)
    if name == "kjv-gpt":
        return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    return F.cross_entropy(out, y)


PRECISIONS = ("f32", "bf16")


def autocast(precision):
    """The context a step's forward and loss run in: nothing for f32;
    torch.autocast("cpu", torch.bfloat16) for bf16, PyTorch's CPU mixed
    precision (matmuls and convolutions in bf16, the rest in f32; master
    weights and optimizer f32), the counterpart of loom's train.precision:
    bf16."""
    if precision == "f32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    raise SystemExit(f"precision {precision!r}: f32 or bf16")


def train_step(name, model, opt, x, y, precision="f32"):
    """The full step: forward, loss, backward, optimizer step, zero_grad."""
    with autocast(precision):
        loss = loss_fn(name, model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss
