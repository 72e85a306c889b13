#!/usr/bin/env bash
# libloom.so exports the public API and nothing else: every symbol it
# exports is declared in include/loom/, and every function declared there
# (other than static inline ones) is exported. Usage: symbols.sh LIBLOOM_SO
set -euo pipefail
src=${LOOM_SRC:?}
lib=${1:?libloom.so}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# C identifiers only: names the compiler makes for itself (clang's OpenMP
# ".gomp_critical_user_.reduction.var") are not loom's API, nor the
# linker's segment bounds (_edata, _end, __bss_start: ld exports them when
# a library linked in exports its own, as PyPI's oneDNN 3.2 does).
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ && $3 ~ /^[A-Za-z_][A-Za-z0-9_]*$/ {print $3}' |
  grep -v -x -E '_edata|_end|__bss_start' | sort -u >"$tmp/exported"
# Declarations in the headers, comments removed; static inline functions
# are the header's own and not exported.
cat "$src"/include/loom/*.h | gcc -fpreprocessed -dD -E -P - 2>/dev/null | tr '\n' ' ' >"$tmp/text"
grep -oE '\bloom_[a-z0-9_]+\b' "$tmp/text" | sort -u >"$tmp/names"
grep -oE 'static inline[^;{(]*\bloom_[a-z0-9_]+\s*\(' "$tmp/text" |
  grep -oE 'loom_[a-z0-9_]+\s*\($' | sed 's/\s*($//' | sort -u >"$tmp/inline"
grep -oE '(\(\*\s*)?\bloom_[a-z0-9_]+\s*\(' "$tmp/text" | grep -v '^(\*' |
  sed 's/\s*($//' | sort -u | comm -23 - "$tmp/inline" >"$tmp/funcs"
# Types and macros that look like calls (loom_status f(...) is a return type).
grep -oE 'typedef[^;]*\b(loom_[a-z0-9_]+)\s*;' "$tmp/text" | grep -oE 'loom_[a-z0-9_]+\s*;$' |
  tr -d '; ' | sort -u >"$tmp/types"
comm -23 "$tmp/funcs" "$tmp/types" >"$tmp/want"

fail=0
extra=$(comm -23 "$tmp/exported" "$tmp/names")
if [ -n "$extra" ]; then
  echo "exported but not declared in include/loom/ (internal symbols leaking):"
  echo "$extra" | sed 's/^/  /'
  fail=$((fail + 1))
fi
missing=$(comm -23 "$tmp/want" "$tmp/exported")
if [ -n "$missing" ]; then
  echo "declared in include/loom/ but not exported by $lib:"
  echo "$missing" | sed 's/^/  /'
  fail=$((fail + 1))
fi
echo "$(wc -l <"$tmp/exported") symbols exported, $(wc -l <"$tmp/want") functions declared"
if [ $fail -ne 0 ]; then
  echo "0 passed, $fail failed"
  exit 1
fi
echo "2 passed, 0 failed"
