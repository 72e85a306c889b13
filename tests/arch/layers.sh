#!/usr/bin/env bash
# The build holds the layers: a file of a layer includes only the public
# headers of the layers below it (CMakeLists.txt's LOOM_DEPS_<layer>, taken
# transitively) and its own folder's headers; a public header includes only
# the headers of its own layer's dependencies. Fails naming file, line and
# the header that breaks the order.
set -euo pipefail
src=${LOOM_SRC:?}
declare -A deps
while read -r layer rest; do
  deps[$layer]="$rest"
done < <(sed -n 's/^set(LOOM_DEPS_\([a-z]*\) *\(.*\))$/\1 \2/p' "$src/CMakeLists.txt" | tr -d '"')
layers=$(sed -n 's/^set(LOOM_LAYERS \(.*\))$/\1/p' "$src/CMakeLists.txt")
[ -n "$layers" ] || { echo "no LOOM_LAYERS in CMakeLists.txt"; exit 1; }

closure() { # the layer and everything below it
  local todo=("$1") seen=" " l
  while [ ${#todo[@]} -gt 0 ]; do
    l=${todo[0]}; todo=("${todo[@]:1}")
    case "$seen" in *" $l "*) continue ;; esac
    seen="$seen$l "
    for d in ${deps[$l]:-}; do todo+=("$d"); done
  done
  echo "$seen"
}

bad=0
check_file() { # file allowed-layers own-dir
  local f=$1 allowed=$2 own=$3 n=0 line h
  while IFS= read -r line; do
    n=$((n + 1))
    [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
    h=${BASH_REMATCH[1]}
    if [[ $h =~ ^loom/([a-z_]+)\.h$ ]]; then
      local l=${BASH_REMATCH[1]}
      case " $allowed " in *" $l "*) continue ;; esac
      echo "${f#$src/}:$n: includes loom/$l.h, a layer it does not sit on (allowed: $allowed)"
      bad=$((bad + 1))
    elif [[ $h == */* ]] || [ ! -e "$own/$h" ]; then
      echo "${f#$src/}:$n: includes \"$h\", not a header of its own folder"
      bad=$((bad + 1))
    fi
  done < "$f"
}

count=0
for layer in $layers; do
  allowed=$(closure "$layer")
  for f in "$src"/src/"$layer"/*.[ch]; do
    check_file "$f" "$allowed" "$src/src/$layer"; count=$((count + 1))
  done
  # The public header sits on the same layers.
  check_file "$src/include/loom/$layer.h" "$allowed" "$src/include/loom"
  count=$((count + 1))
done
# The CLI sits on everything (loom.h); no layer includes loom.h.
for f in "$src"/src/cli/*.[ch]; do
  check_file "$f" "$layers loom" "$src/src/cli"; count=$((count + 1))
done
echo "checked $count files of $(echo $layers | wc -w) layers and the CLI"
if [ $bad -ne 0 ]; then
  echo "0 passed, $bad failed"
  exit 1
fi
echo "$count passed, 0 failed"
