#!/usr/bin/env bash
# The copies of the vector code per instruction set (LOOM_ISA) give the same
# bits: the MLP, the CNN and the GPT trained a few steps with each copy this
# CPU runs leave byte-identical checkpoints (weights, optimizer state, data
# position). The log names the copy in use; a LOOM_ISA that names no
# instruction set, or one this CPU lacks, is refused with exit code 2.
# `loom bench kernels` times each copy.
. "$(dirname "$0")/../lib.sh"
# One thread: the results do not depend on it, and the suite runs beside
# other tests on a loaded machine.
export LOOM_THREADS=1 OMP_NUM_THREADS=1

cfg=$SRC/examples/small_mlp.yaml
LOOM_ISA=sse2 "$LOOM" config check "$cfg" >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "LOOM_ISA=sse2: not an instruction set; supported: auto, base, avx2, avx512" "$tmp/out" &&
  ok "unknown LOOM_ISA refused" || { bad "unknown LOOM_ISA (rc $rc)"; cat "$tmp/out"; }

isas=base
for isa in avx2 avx512; do
  if LOOM_ISA=$isa "$LOOM" config check "$cfg" >"$tmp/out" 2>&1; then
    isas="$isas $isa"
  else
    grep -q "LOOM_ISA=$isa: this CPU cannot run it\|no $isa copy" "$tmp/out" &&
      ok "$isa refused where it cannot run (not compared)" ||
      { bad "LOOM_ISA=$isa failed for another reason"; cat "$tmp/out"; }
  fi
done
echo "# copies compared: $isas"

for isa in $isas; do
  LOOM_ISA=$isa LOOM_LOG=info "$LOOM" train "$cfg" --steps 1 --resume never \
    --set "checkpoint.dir=$tmp/log_$isa" >"$tmp/out" 2>&1
  grep -q "^kernels: $isa " "$tmp/out" && ok "log names $isa" ||
    { bad "log does not name $isa"; cat "$tmp/out"; }
done

# loom bench kernels times the copy in use (bench/kernels.sh alternates them)
for isa in $isas; do
  LOOM_ISA=$isa "$LOOM" bench kernels --reps 1 >"$tmp/out" 2>&1 &&
    grep -q "^# loom bench kernels: copy $isa," "$tmp/out" &&
    [ "$(grep -cE '^[a-z].* [0-9]+\.[0-9]{3} +[0-9]+\.[0-9]{3}$' "$tmp/out")" = 12 ] &&
    ok "bench kernels with $isa: 12 kernels timed" ||
    { bad "bench kernels with $isa"; cat "$tmp/out"; }
done
"$LOOM" bench kernels --reps 0 >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "reps wants a count in \[1, " "$tmp/out" &&
  ok "bench kernels refuses --reps 0" || { bad "bench kernels --reps 0 (rc $rc)"; cat "$tmp/out"; }
# --threads above LOOM_THREADS_MAX (4096, as LOOM_THREADS and train.threads)
# is a usage error before anything runs (100000 was taken and run)
for b in train kernels gemm; do
  timeout 60 "$LOOM" bench $b --threads 100000 >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "^loom bench $b: --threads wants a count in \[[01], 4096\], not '100000'" "$tmp/out" &&
    ok "bench $b refuses --threads 100000" || { bad "bench $b --threads 100000 (rc $rc)"; cat "$tmp/out"; }
done

for model in small_mlp small_cnn small_gpt; do
  for isa in $isas; do
    LOOM_ISA=$isa "$LOOM" train "$SRC/examples/$model.yaml" --steps 4 --quiet \
      --resume never --set "checkpoint.dir=$tmp/${model}_$isa" >"$tmp/out" 2>&1 ||
      { bad "$model with $isa did not train"; cat "$tmp/out"; }
  done
  a=$tmp/${model}_base/step_00000004/shard_00000.bin
  [ -s "$a" ] || bad "$model: no checkpoint with base"
  for isa in $isas; do
    [ $isa = base ] && continue
    b=$tmp/${model}_$isa/step_00000004/shard_00000.bin
    [ -s "$a" ] && cmp -s "$a" "$b" && ok "$model: base and $isa give the same bits" ||
      bad "$model: base and $isa checkpoints differ"
  done
done

finish kernels_isa
