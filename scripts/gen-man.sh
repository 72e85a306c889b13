#!/usr/bin/env bash
# Writes the man pages of loom and its commands from the same text as
# --help (so the two never disagree): loom.1 from `loom --help`, loom-CMD.1
# from `loom CMD --help`. Usage: gen-man.sh LOOM_BINARY OUT_DIR
set -euo pipefail
loom=${1:?loom binary} out=${2:?output directory}
mkdir -p "$out"
version=$("$loom" --version | awk '{print $2}')
date=$(date -u +%Y-%m-%d -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}")

# roff-safe: a leading '.' or "'" would be a request; backslashes doubled.
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

page() { # name summary help-text
  local name=$1 summary=$2 text=$3 upper
  upper=$(echo "$name" | tr '[:lower:]-' '[:upper:]-')
  {
    echo ".TH $upper 1 \"$date\" \"loom $version\" \"loom manual\""
    echo ".SH NAME"
    echo "$name \\- $summary"
    echo ".SH SYNOPSIS"
    echo ".nf"
    echo "$text" | awk '/^usage:|^       loom/ {sub(/^usage: /, ""); sub(/^       /, ""); print; next} {exit}' | esc
    echo ".fi"
    echo ".SH DESCRIPTION"
    echo ".nf"
    echo "$text" | awk 'f {print} /^$/ && !f {f=1}' | esc
    echo ".fi"
    echo ".SH SEE ALSO"
    echo "The user guide in loom's docs/ folder; \\fBloom\\fR(1)."
  } >"$out/$name.1"
}

main_help=$("$loom" --help)
page loom "train neural networks across cores, processes and machines" "$main_help"
echo "$main_help" | awk '/^commands:/ {f=1; next} f && /^  [a-z]+ / {print $1 "\t" substr($0, index($0, $2))} /^$/ && f {exit}' |
  while IFS=$'\t' read -r cmd summary; do
    [ "$cmd" = help ] && continue
    page "loom-$cmd" "$summary" "$("$loom" "$cmd" --help 2>&1)"
  done
ls "$out"
