#!/usr/bin/env bash
# Shared by the script tests: the loom binary and source tree, a temporary
# directory removed at exit, ok/bad checks, and a job under loom run.
# Source it first; end the script with `finish NAME`.
set -u
LOOM=${LOOM_BIN:?LOOM_BIN must name the loom executable}
SRC=${LOOM_SRC:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() {
  echo "FAILED: $1"
  fail=1
}
run() { # N ARGS...: loom run -n N loom ARGS (output in $tmp/out, code in $rc)
  local n=$1
  shift
  "$LOOM" run -n "$n" --timeout 120 "$LOOM" "$@" >"$tmp/out" 2>&1
  rc=$?
}
finish() { # NAME: the summary line and the exit status
  [ $fail = 0 ] && echo "$1: all passed"
  exit $fail
}
