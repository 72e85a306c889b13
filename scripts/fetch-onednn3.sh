#!/usr/bin/env bash
# oneDNN 3.2 (GNU OpenMP build) from PyPI's onednn-cpu-gomp and
# onednn-devel-cpu-gomp 2023.2.0 wheels, unpacked into a prefix with lib/
# and include/; prints the prefix. Idempotent. Build loom against it with
#   cmake -S . -B build-dnnl3 -DLOOM_DNNL_ROOT="$(scripts/fetch-onednn3.sh)"
# (docs/precision.md: oneDNN 3.x has f16 kernels for AVX512-FP16 CPUs, which
# Debian's 2.6.3 lacks; everything else works with either).
#   LOOM_DNNL3_PREFIX: where (default ~/.cache/loom/onednn-3.2).
set -euo pipefail
prefix=${LOOM_DNNL3_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/onednn-3.2}
if [ -f "$prefix/lib/libdnnl.so.3" ] && [ -f "$prefix/include/oneapi/dnnl/dnnl.h" ]; then
  echo "$prefix"
  exit 0
fi
ver=2023.2.0
# sha256 of the two wheels as PyPI serves them (checked 2026-11-27)
declare -A sum=(
  [onednn_cpu_gomp]=2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb
  [onednn_devel_cpu_gomp]=9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284
)
mkdir -p "$(dirname "$prefix")"
work=$(mktemp -d "$(dirname "$prefix")/onednn-fetch.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
# pip from the tests' virtual environment (a fresh Debian has none of its own)
PY=$(bash "$(dirname "$0")/ensure-pyenv.sh")
echo "fetch-onednn3: pip download onednn-cpu-gomp onednn-devel-cpu-gomp $ver" >&2
"$PY" -m pip download -q --disable-pip-version-check --no-deps \
  --only-binary=:all: --platform manylinux1_x86_64 -d "$work" \
  "onednn-cpu-gomp==$ver" "onednn-devel-cpu-gomp==$ver" >&2
for name in "${!sum[@]}"; do
  whl=$(ls "$work/$name-$ver-"*.whl)
  got=$(sha256sum "$whl" | cut -d' ' -f1)
  if [ "$got" != "${sum[$name]}" ]; then
    echo "fetch-onednn3: $whl: sha256 $got, expected ${sum[$name]}" >&2
    exit 1
  fi
done
# Each wheel keeps its files under <name>-<ver>.data/data/{lib,include};
# the runtime's lib/ holds real files, the devel wheel's the headers.
"$PY" - "$work" "$work/prefix" <<'EOF'
import os, sys, zipfile, glob
work, out = sys.argv[1], sys.argv[2]
for whl in sorted(glob.glob(os.path.join(work, "*.whl"))):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if len(parts) < 4 or parts[1] != "data" or not parts[0].endswith(".data"):
                continue
            if parts[2] not in ("lib", "include") or info.is_dir():
                continue
            rel = os.path.normpath(os.path.join(*parts[2:]))
            if rel.startswith("..") or os.path.isabs(rel):
                continue
            dst = os.path.join(out, rel)
            if os.path.exists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(info) as src, open(dst, "wb") as f:
                f.write(src.read())
# The wheel holds libdnnl.so, .so.3 and .so.3.2 as three copies (a zip has
# no links); keep the soname's file and make the other two links to it.
lib = os.path.join(out, "lib")
for name in ("libdnnl.so", "libdnnl.so.3.2"):
    p = os.path.join(lib, name)
    if os.path.isfile(p) and not os.path.islink(p):
        os.unlink(p)
        os.symlink("libdnnl.so.3", p)
EOF
test -f "$work/prefix/lib/libdnnl.so.3" && test -f "$work/prefix/include/oneapi/dnnl/dnnl.h"
mkdir -p "$prefix"
for d in lib include; do
  [ -e "$prefix/$d" ] || mv -T "$work/prefix/$d" "$prefix/$d"
done
if [ ! -f "$prefix/lib/libdnnl.so.3" ] || [ ! -f "$prefix/include/oneapi/dnnl/dnnl.h" ]; then
  echo "fetch-onednn3: $prefix holds lib/ or include/ without oneDNN 3.2's files (not ours: move it away)" >&2
  exit 1
fi
echo "$prefix"
