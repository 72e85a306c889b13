#!/usr/bin/env bash
# loom run removes its job directory ($TMPDIR/loom-run-*) without following
# a link planted in it: the link's target stays intact, the link and what
# holds it are left and reported; a job with nothing planted leaves nothing.
set -u
LOOM=${LOOM_BIN:?}
T=$(mktemp -d /tmp/loom_safety_run.XXXXXX)
trap 'rm -rf "$T"' EXIT
passed=0
failed=0
check() {
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
    passed=$((passed + 1))
  else
    echo "FAILED: $what"
    failed=$((failed + 1))
  fi
}
mkdir "$T/tmp" "$T/victim"
echo precious >"$T/victim/rank-0"
before=$(tar --sort=name --mtime=@0 -cf - -C "$T/victim" . | sha256sum)

TMPDIR=$T/tmp "$LOOM" run -n 1 true >"$T/out" 2>&1
check "plain job: exit 0" test $? -eq 0
check "plain job: nothing left in TMPDIR" test -z "$(ls -A "$T/tmp")"

# The job plants a link to the victim directory, named like a status file.
TMPDIR=$T/tmp "$LOOM" run -n 1 -- sh -c \
  'ln -s "$0" "$LOOM_RUN_DIR/rank-7"' "$T/victim" >"$T/out" 2>&1
check "planted link: exit 0" test $? -eq 0
after=$(tar --sort=name --mtime=@0 -cf - -C "$T/victim" . | sha256sum)
check "planted link: victim intact" test "$before" = "$after"
check "planted link: reported" grep -qF "attempt-0/rank-7: a symbolic link, not followed; left in place" "$T/out"
check "planted link: the link itself kept" test -L "$(echo "$T"/tmp/loom-run-*/attempt-0/rank-7)"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
