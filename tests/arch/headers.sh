#!/usr/bin/env bash
# Every public header compiles alone, and loom.h with all of them, as C99
# and C11 with -pedantic and no warning: a user's stricter flags never
# break on loom's headers (a typedef given twice is an error before C11).
# Usage: headers.sh CC
set -euo pipefail
src=${LOOM_SRC:?}
cc=${1:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
for std in c99 c11; do
  for h in "$src"/include/loom/*.h; do
    name=$(basename "$h")
    printf '#include <loom/%s>\n#include <loom/%s>\n' "$name" "$name" > "$tmp/t.c"
    if ! "$cc" -std=$std -Wall -Wextra -pedantic -Werror -fsyntax-only \
        -I"$src/include" "$tmp/t.c" 2> "$tmp/err"; then
      echo "loom/$name does not compile alone under -std=$std -pedantic:"
      cat "$tmp/err"
      bad=1
    fi
  done
done
[ $bad -eq 0 ] && echo "headers: all compile alone under -std=c99 and -std=c11 -pedantic"
exit $bad
