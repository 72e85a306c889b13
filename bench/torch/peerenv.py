"""Process setup shared by the PyTorch peer benchmarks (imports no torch: call pin_threads() before torch loads)."""

import json
import os
import statistics
import sys
import time


def pin_threads(n):
    """Give every thread pool in the process n threads.

    Must run before `import torch`: libgomp and OpenBLAS read their
    environment once, when they load. PASSIVE stops idle OpenMP threads from
    spinning, which on a 2-core machine would steal the core of a second
    process (DDP) or of loom running beside us.
    """
    n = str(int(n))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = n
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def own_dir(path, name):
    """Claim a directory the user named for a bench's files (--run-dir).

    The bench removes and rewrites names inside it, so it must be new, empty,
    or one this same bench made before (its .loom-bench file holds the name);
    anything else is refused (SystemExit 2), so no file of the user's is
    overwritten or removed. Makes it when missing (its parent must exist).
    """
    mark = os.path.join(path, ".loom-bench")
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path)):
        note(f"{name}: {path}: not a directory of its own (a link or a file); name a new or empty directory")
        raise SystemExit(2)
    if os.path.isdir(path) and os.listdir(path):
        try:
            if os.path.islink(mark) or open(mark).read().strip() != name:
                raise OSError
        except OSError:
            note(f"{name}: {path} holds files this bench did not make; name a new or empty directory "
                 "(the bench removes and rewrites names inside it)")
            raise SystemExit(2)
        return
    if not os.path.isdir(path):
        try:
            os.mkdir(path)
        except OSError as e:
            note(f"{name}: cannot make {path} (its parent must exist): {e.strerror}")
            raise SystemExit(2)
    with open(mark, "w") as f:
        f.write(name + "\n")


def note(*parts):
    """A human note: stderr, so stdout stays one JSON object per line."""
    print("[torch-peer]", *parts, file=sys.stderr, flush=True)


def emit(obj):
    """One result line on stdout."""
    print(json.dumps(obj, sort_keys=False), flush=True)


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def blas_library():
    """Which BLAS Debian's generic-BLAS PyTorch ends up calling (alternatives link)."""
    path = "/usr/lib/x86_64-linux-gnu/libblas.so.3"
    try:
        return os.path.realpath(path)
    except OSError:
        return None


def peer_info(torch):
    """Fields every result line carries so a table can say what was measured."""
    return {
        "impl": "pytorch",
        "version": torch.__version__,
        "python": sys.executable,
        "blas": blas_library() if torch.__version__.startswith("1.13") and not torch.backends.mkl.is_available()
        else ("MKL (bundled with the wheel)" if torch.backends.mkl.is_available() else blas_library()),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        # ATen's kernel set (AVX512, AVX2, DEFAULT): BENCH_ISA caps it
        "cpu_capability": torch.backends.cpu.get_cpu_capability()
        if hasattr(torch.backends, "cpu") else None,
    }


def summarize(times):
    """Median and spread of per-step wall times (seconds)."""
    s = sorted(times)
    n = len(s)

    def q(p):
        return s[min(n - 1, max(0, int(round(p * (n - 1)))))]

    return {
        "median_s": statistics.median(s),
        "p10_s": q(0.10),
        "p90_s": q(0.90),
        "mean_s": sum(s) / n,
        "n": n,
    }


def wall():
    """Wall-clock seconds comparable across processes (timestamps in files)."""
    return time.time()


def process_start_time():
    """When this process was created (wall clock), from /proc; None if unknown.

    Lets the recovery benchmark see the time a restarted worker spent
    before Python ran its first line (fork/exec, interpreter start).
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # field 22 of proc(5), counted after ")": clock ticks since boot
        start_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        now_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (now_boot - start_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
