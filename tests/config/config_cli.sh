#!/usr/bin/env bash
# loom config check / show / schema: exit codes (2 for a bad config, with
# the one-line message), --set, and that 'show' output reads back the same.
set -u
LOOM=${LOOM_BIN:?}
SRC=${LOOM_SRC:?}
T=$(mktemp -d /tmp/loom_config_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
passes=0
check() {
  local name=$1
  shift
  if "$@"; then passes=$((passes + 1)); else
    echo "FAIL: $name (rc=$rc, output: $out)" >&2
    fails=$((fails + 1))
  fi
}
run() {
  out=$("$@" 2>&1)
  rc=$?
}
is() { [ "$out" = "$1" ]; }
has() { grep -qF -- "$1" <<<"$out"; }

for f in "$SRC"/examples/*.yaml; do
  run "$LOOM" config check "$f"
  check "check $(basename "$f")" test "$rc" -eq 0
done
printf 'optim:\n  lrr: 0.1\n' >"$T/bad.yaml"
run "$LOOM" config check "$T/bad.yaml"
check "bad config exits 2" test "$rc" -eq 2
check "bad config message" is "loom: $T/bad.yaml:2:3: key 'optim.lrr': unknown key (did you mean 'optim.lr'?)"
run "$LOOM" config check "$SRC/examples/fashion_mlp.yaml" --set optim.lr=abc
check "bad --set exits 2" test "$rc" -eq 2
check "bad --set message" is "loom: --set optim.lr=abc: key 'optim.lr': expected a number, got 'abc'"
run "$LOOM" config check "$T/missing.yaml"
check "missing file exits 2" test "$rc" -eq 2
check "missing file message" is "loom: $T/missing.yaml: cannot open config: No such file or directory"

# show: every key, overrides applied; reading it back gives the same hash.
run "$LOOM" config show "$SRC/examples/kjv_gpt.yaml" --set train.steps=10 --set=optim.lr=0.001
check "show exits 0" test "$rc" -eq 0
check "show has the override" has "  steps: 10"
check "show has the other override" has "  lr: 0.001"
check "show has defaults" has "  virtual_shards: 8"
printf '%s\n' "$out" >"$T/shown.yaml"
h1=$(sed -n 's/.*config hash \(0x[0-9a-f]*\).*/\1/p' "$T/shown.yaml" | head -1)
run "$LOOM" config check "$T/shown.yaml"
check "shown reads back" test "$rc" -eq 0
check "same hash" has "$h1"

# log.mlflow: a group of keys inside a section; the uri checked.
printf 'log:\n  mlflow:\n    uri: http://127.0.0.1:5000\n    experiment: e1\n' >"$T/mlflow.yaml"
run "$LOOM" config check "$T/mlflow.yaml"
check "log.mlflow as a group reads" test "$rc" -eq 0
printf 'log:\n  mlflow:\n    uri: ftp://x\n' >"$T/mlflow_bad.yaml"
run "$LOOM" config check "$T/mlflow_bad.yaml"
check "a bad log.mlflow.uri exits 2" test "$rc" -eq 2
check "naming the place and what is supported" has "mlflow_bad.yaml:3:5: key 'log.mlflow.uri': 'ftp://x': the scheme is not http:// or https://: expected the tracking server as http://HOST:PORT"
# URIs libcurl could never reach: refused here, not after a run's retries.
for u in "http://127.0.0.1:99999|port '99999' is not a number of 1-65535" \
  "http://exa mple.com|a space at byte 11" "http://:5000|no host" \
  "https://|no host" "http://x:0|port '0'" "http://x:5000x|port '5000x'" \
  "http://[::1|an IPv6 host without its ']'"; do
  run "$LOOM" config check "$T/mlflow.yaml" --set "log.mlflow.uri=${u%%|*}"
  check "log.mlflow.uri '${u%%|*}' exits 2" test "$rc" -eq 2
  check "naming the key and why ('${u#*|}')" has "key 'log.mlflow.uri': '${u%%|*}': ${u#*|}"
done
for u in "http://[::1]:5000/" "https://mlflow.example.com/prefix" "http://user@h:80"; do
  run "$LOOM" config check "$T/mlflow.yaml" --set "log.mlflow.uri=$u"
  check "log.mlflow.uri '$u' passes" test "$rc" -eq 0
done
printf 'log:\n  mlflow:\n    url: http://x\n' >"$T/mlflow_key.yaml"
run "$LOOM" config check "$T/mlflow_key.yaml"
check "an unknown key in the group exits 2" test "$rc" -eq 2
check "naming it" has "key 'log.mlflow.url': unknown key (did you mean 'log.mlflow.uri'?)"

run "$LOOM" config schema
check "schema lists keys" has "parallel.bucket_mb"
run "$LOOM" config schema --markdown
check "markdown table" has "| \`optim.lr\` | float | \`0.01\` |"
run "$LOOM" config
check "no args exits 2" test "$rc" -eq 2
run "$LOOM" config --help
check "help exits 0" test "$rc" -eq 0

echo "$passes passed, $fails failed"
test "$fails" -eq 0
