# Shell helpers shared by the bench/ scripts: fair thread settings, the PyTorch peer, load average, ports, tables.
# Source it: `. "$(dirname "$0")/lib.sh"` (bash). Functions only; sets no options of the caller.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOOM_ROOT=$(cd "$BENCH_DIR/.." && pwd)
# The PyTorch peer: LOOM_TORCH=pypi (default) is PyPI's torch, the one people
# install today, in a virtual environment made on first use (LOOM_TORCH_VENV,
# default ~/.cache/loom/torch-venv; about 5 GB with its CUDA libraries, which
# stay unused: the peer runs on the CPU); LOOM_TORCH=debian is Debian's
# python3-torch (1.13) under /usr/bin/python3. TORCH_PYTHON overrides both.
LOOM_TORCH=${LOOM_TORCH:-pypi}
bench_torch_python_named=${TORCH_PYTHON:-} # the user's, for the tables' reason
LOOM_TORCH_VENV=${LOOM_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/torch-venv}
if [ "$LOOM_TORCH" = debian ]; then
  TORCH_PYTHON=${TORCH_PYTHON:-/usr/bin/python3}
else
  TORCH_PYTHON=${TORCH_PYTHON:-$LOOM_TORCH_VENV/bin/python}
fi
export LOOM_TORCH LOOM_TORCH_VENV

# A note for the reader: stderr, so stdout stays machine-readable.
bench_note() { echo "[bench] $*" >&2; }

# "1-min 5-min 15-min" load averages.
bench_loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# The CPU model and the flags that choose loom's kernels, above every table:
# figures from different machines are never compared.
bench_cpu_header() {
  local model flags f have="" lack=""
  model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
  flags=$(awk -F': *' '/^flags/ {print $2; exit}' /proc/cpuinfo)
  for f in avx2 fma avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16; do
    case " $flags " in
    *" $f "*) have="$have $f" ;;
    *) lack="$lack${lack:+,} $f" ;;
    esac
  done
  # the flags it lacks are named too: "no avx512_bf16" is what decides a
  # bf16 path, and a reader should not have to know which were looked for
  echo "# cpu: ${model:-unknown}, $(nproc) cores; flags:${have:- none}${lack:+ (not:$lack)}"
}

# BENCH_ISA=avx2: both sides as on a CPU with AVX2 and FMA only (no AVX-512,
# no bf16 instructions), on a machine that has more: loom's own kernels
# (LOOM_ISA), its bf16 path (LOOM_BF16_PATH=convert) and its oneDNN
# (ONEDNN_MAX_CPU_ISA); PyTorch's ATen kernels (ATEN_CPU_CAPABILITY), its
# oneDNN and its MKL (MKL_ENABLE_INSTRUCTIONS). The clock, caches and memory
# stay this machine's, so the table says it is an emulation. Unset or
# "native": nothing capped.
bench_cap_isa() {
  case "${BENCH_ISA:-native}" in
  native) ;;
  avx2)
    export LOOM_ISA=avx2 LOOM_BF16_PATH=convert ONEDNN_MAX_CPU_ISA=AVX2 \
      ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
    echo "# emulated AVX2-only CPU (BENCH_ISA=avx2): LOOM_ISA=avx2 LOOM_BF16_PATH=convert ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2; this CPU's clock, caches and memory"
    ;;
  *)
    echo "BENCH_ISA=$BENCH_ISA: expected native or avx2" >&2
    exit 2
    ;;
  esac
}

# Refuse nothing, but say when the numbers will be low: load above the core count.
bench_check_load() {
  bench_cpu_header
  local l n
  l=$(cut -d' ' -f1 /proc/loadavg)
  n=$(nproc)
  if awk -v l="$l" -v n="$n" 'BEGIN { exit !(l > n * 0.5) }'; then
    bench_note "load average $(bench_loadavg) on $n cores: the machine is busy, timings will be low"
  fi
}

# Equal thread counts for loom and PyTorch: N threads per process, no spinning
# OpenMP workers (they steal the core of a second process on a small machine).
bench_fair_env() {
  export OMP_NUM_THREADS="$1" OPENBLAS_NUM_THREADS="$1" MKL_NUM_THREADS="$1"
  export OMP_WAIT_POLICY=PASSIVE
}

# Makes the peer importable (the venv or python3-torch) if it is not; sets
# TORCH_VERSION_LINE and says it on stderr.
bench_ensure_torch() {
  TORCH_VERSION_LINE=$(TORCH_PYTHON="$TORCH_PYTHON" bash "$BENCH_DIR/torch/ensure_torch.sh") || return 1
  bench_note "peer: $TORCH_VERSION_LINE"
}

# Whether the PyTorch peer runs: not with NO_TORCH=1 or TORCH=0 (either
# spelling, in every script), nor when the peer cannot be installed; the
# benchmark then measures loom alone. Sets TORCH_PEER to "PyTorch VERSION", or
# to why there is no peer, for the tables.
bench_torch_peer() {
  if [ "${NO_TORCH:-0}" = 1 ] || [ "${TORCH:-1}" = 0 ]; then
    TORCH_PEER="PyTorch: skipped (NO_TORCH=1 / TORCH=0)"
    bench_note "no PyTorch peer: NO_TORCH=1 / TORCH=0"
    return 1
  fi
  if ! bench_ensure_torch; then
    TORCH_PEER="PyTorch: not available (ensure_torch.sh failed)"
    [ -z "$bench_torch_python_named" ] ||
      TORCH_PEER="PyTorch: not available (TORCH_PYTHON=$bench_torch_python_named cannot import torch)"
    bench_note "no PyTorch peer: bench/torch/ensure_torch.sh failed"
    return 1
  fi
  TORCH_PEER="PyTorch $(echo "$TORCH_VERSION_LINE" | cut -d' ' -f2)"
}

# make bench's summary: a benchmark's headline figures, appended as lines of
# tab-separated fields   measure  unit  loom  peer  peer-name   ("-" for a
# figure not measured) to the file $BENCH_HEADLINES names when run_all.sh
# set it, and to nothing otherwise. Summarisers in awk and Python append to
# that file themselves, in the same format.
bench_headline() {
  [ -n "${BENCH_HEADLINES:-}" ] || return 0
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$BENCH_HEADLINES"
}

# Runs a peer script: bench_torch train_throughput --model fashion-mlp --threads 1 ...
# (JSON lines on stdout, notes on stderr).
bench_torch() {
  local script=$1
  shift
  OMP_WAIT_POLICY=PASSIVE "$TORCH_PYTHON" "$BENCH_DIR/torch/$script.py" "$@"
}

# A directory the user named for a bench's files (KEEP=DIR, RUN_DIR=DIR):
# the bench writes and removes names inside it, so it must be new, empty, or
# one this same bench made before (its .loom-bench file says which); a
# directory holding anything else is refused, so no file of the user's is
# overwritten or removed. Makes DIR when missing (its parent must exist).
#   bench_own_dir DIR BENCH_NAME || exit 2
bench_own_dir() {
  local dir=$1 name=$2 mark
  mark="$dir/.loom-bench"
  if [ -L "$dir" ] || { [ -e "$dir" ] && [ ! -d "$dir" ]; }; then
    echo "$name: $dir: not a directory of its own (a link or a file); name a new or empty directory" >&2
    return 1
  fi
  if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    if [ ! -f "$mark" ] || [ -L "$mark" ] || [ "$(cat "$mark")" != "$name" ]; then
      echo "$name: $dir holds files this bench did not make; name a new or empty directory (the bench removes and rewrites names inside it)" >&2
      return 1
    fi
    return 0
  fi
  if [ ! -d "$dir" ] && ! mkdir -- "$dir"; then
    echo "$name: cannot make $dir (its parent must exist)" >&2
    return 1
  fi
  echo "$name" >"$mark"
}

# A free TCP port on 127.0.0.1 (for a rendezvous). python3, not the peer's
# interpreter: that one may be missing (the peer not available).
bench_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Prints a comparison table from JSON result lines (files or stdin), loom's and
# PyTorch's side by side: bench_table results.jsonl   or   ... | bench_table
# Also appends their headline lines to $BENCH_HEADLINES when it is set, the
# peer named TORCH_PEER when PyTorch gave no line. python3 (table.py needs
# only json): loom's rows print when the peer's interpreter is missing too.
bench_table() {
  python3 "$BENCH_DIR/torch/table.py" ${BENCH_HEADLINES:+--headlines "$BENCH_HEADLINES"} \
    ${TORCH_PEER:+--peer "$TORCH_PEER"} "$@"
}
