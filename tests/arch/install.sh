#!/usr/bin/env bash
# A library people can install: `cmake --install` into a temporary prefix,
# then examples/train_api.c is built against it twice, with pkg-config
# (shared library) and with CMake's find_package(loom) (static library),
# and both programs train 3 steps. Everything stays in the test's own
# temporary directory.
set -euo pipefail
src=${LOOM_SRC:?} build=${LOOM_BUILD:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAILED: $1"; fail=$((fail + 1)); }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; echo "0 passed, 1 failed"; exit 1; }
for f in bin/loom include/loom/loom.h include/loom/run.h; do
  [ -e "$tmp/prefix/$f" ] && ok "installed $f" || bad "installed $f"
done
lib=$(ls -d "$tmp"/prefix/lib*/ | head -1); lib=${lib%/}
for f in libloom.a libloom.so pkgconfig/loom.pc cmake/loom/loomConfig.cmake; do
  [ -e "$lib/$f" ] && ok "installed lib/$f" || bad "installed lib/$f"
done
for f in share/man/man1/loom.1 share/man/man1/loom-run.1 share/bash-completion/completions/loom; do
  [ -e "$tmp/prefix/$f" ] && ok "installed $f" || bad "installed $f"
done
man -l "$tmp/prefix/share/man/man1/loom-train.1" >"$tmp/man.txt" 2>/dev/null || true
if grep -q 'loom train CONFIG' "$tmp/man.txt"; then
  ok "man loom-train shows its usage"
else
  bad "man loom-train shows its usage"
fi
# The completion offers the commands and a command's options.
if bash -c '. "$1"; COMP_WORDS=(loom r); COMP_CWORD=1; _loom; printf "%s\n" "${COMPREPLY[@]}"' _ \
  "$tmp/prefix/share/bash-completion/completions/loom" | grep -x run >/dev/null &&
  PATH="$tmp/prefix/bin:$PATH" bash -c '. "$1"; COMP_WORDS=(loom run --max-r); COMP_CWORD=2; _loom; printf "%s\n" "${COMPREPLY[@]}"' _ \
  "$tmp/prefix/share/bash-completion/completions/loom" | grep -x -- --max-restarts >/dev/null; then
  ok "bash completion: commands and options"
else
  bad "bash completion: commands and options"
fi

# pkg-config, against the shared library.
export PKG_CONFIG_PATH="$lib/pkgconfig"
if cc -std=c11 $(pkg-config --cflags loom) "$src/examples/train_api.c" -o "$tmp/api_pc" \
  $(pkg-config --libs loom) 2>"$tmp/pc.log"; then
  ok "built train_api with pkg-config"
  if (cd "$tmp" && LD_LIBRARY_PATH="$lib" ./api_pc 3 >"$tmp/pc.out" 2>&1); then
    ok "train_api (pkg-config, shared) trained"
  else
    cat "$tmp/pc.out"; bad "train_api (pkg-config, shared) trained"
  fi
  # The program runs on the installed library, not on the build tree's.
  # (ldd's output kept first: grep -q closing the pipe early would fail it
  # under pipefail.)
  LD_LIBRARY_PATH="$lib" ldd "$tmp/api_pc" >"$tmp/ldd.txt" 2>&1 || true
  if grep -q "$lib/libloom.so" "$tmp/ldd.txt"; then
    ok "linked against the installed libloom.so"
  else
    bad "linked against the installed libloom.so"
  fi
else
  cat "$tmp/pc.log"; bad "built train_api with pkg-config"
fi

# CMake package, against the static library.
mkdir -p "$tmp/cm"
cat >"$tmp/cm/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.20)
project(loom_user C)
find_package(loom 0.1 REQUIRED)
add_executable(api_cm $src/examples/train_api.c)
target_link_libraries(api_cm PRIVATE loom::loom_static)
CM
if cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/cm.log" 2>&1 &&
  cmake --build "$tmp/cm/build" >>"$tmp/cm.log" 2>&1; then
  ok "built train_api with find_package(loom)"
  if (cd "$tmp" && ./cm/build/api_cm 3 >"$tmp/cm.out" 2>&1); then
    ok "train_api (CMake, static) trained"
  else
    cat "$tmp/cm.out"; bad "train_api (CMake, static) trained"
  fi
else
  cat "$tmp/cm.log"; bad "built train_api with find_package(loom)"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
