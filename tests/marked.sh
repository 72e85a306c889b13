#!/usr/bin/env bash
# Processes of this test alone. Tests that share a binary run side by side
# under ctest -j, so "processes left behind" cannot be found by the binary's
# name: a test starts its jobs with LOOM_TEST_MARK=$mark in their
# environment (loom run and the MPI launcher pass it to every rank) and
# looks for that mark. The script itself does not export it, so its own
# subshells never match.
mark="$(basename "$0").$$.$RANDOM"
# The live (not zombie) processes whose environment holds the mark.
marked_live() {
  local f p
  # One grep over every process's environment (a zombie's reads empty).
  grep -lzx "LOOM_TEST_MARK=$mark" /proc/[0-9]*/environ 2>/dev/null | while read -r f; do
    p=${f#/proc/}
    p=${p%/environ}
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] || echo "$p"
  done
}
# Polls (up to 10 s, never a fixed sleep) until no marked process is left.
# If some stay, prints them, kills them and fails.
marked_left() {
  local left end=$((SECONDS + 10))
  while :; do
    left=$(marked_live)
    [ -z "$left" ] && return 0
    [ $SECONDS -ge $end ] && break
    sleep 0.05
  done
  ps -o pid,args -p "$(echo "$left" | paste -sd,)" 2>/dev/null | tail -n +2
  # shellcheck disable=SC2086
  kill -9 $left 2>/dev/null
  return 1
}
