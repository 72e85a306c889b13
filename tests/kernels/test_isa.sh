#!/usr/bin/env bash
# The copies of the vector code per instruction set (LOOM_ISA) give the same
# bits: the MLP, the CNN and the GPT trained a few steps with each copy this
# CPU runs leave byte-identical checkpoints (weights, optimizer state, data
# position). The log names the copy in use; a LOOM_ISA that names no
# instruction set, or one this CPU lacks, is refused with exit code 2.
. "$(dirname "$0")/../lib.sh"
# One thread: the results do not depend on it, and the suite runs beside
# other tests on a loaded machine.
export LOOM_THREADS=1 OMP_NUM_THREADS=1

cfg=$SRC/examples/small_mlp.yaml
LOOM_ISA=sse2 "$LOOM" config check "$cfg" >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "LOOM_ISA=sse2: not an instruction set; supported: auto, base, avx2" "$tmp/out" &&
  ok "unknown LOOM_ISA refused" || { bad "unknown LOOM_ISA (rc $rc)"; cat "$tmp/out"; }

isas=base
if LOOM_ISA=avx2 "$LOOM" config check "$cfg" >"$tmp/out" 2>&1; then
  isas="base avx2"
else
  grep -q "LOOM_ISA=avx2: this CPU cannot run it\|no avx2 copy" "$tmp/out" &&
    ok "avx2 refused where it cannot run (only base compared)" ||
    { bad "LOOM_ISA=avx2 failed for another reason"; cat "$tmp/out"; }
fi

for isa in $isas; do
  LOOM_ISA=$isa LOOM_LOG=info "$LOOM" train "$cfg" --steps 1 --resume never \
    --set "checkpoint.dir=$tmp/log_$isa" >"$tmp/out" 2>&1
  grep -q "^kernels: $isa " "$tmp/out" && ok "log names $isa" ||
    { bad "log does not name $isa"; cat "$tmp/out"; }
done

for model in small_mlp small_cnn small_gpt; do
  for isa in $isas; do
    LOOM_ISA=$isa "$LOOM" train "$SRC/examples/$model.yaml" --steps 4 --quiet \
      --resume never --set "checkpoint.dir=$tmp/${model}_$isa" >"$tmp/out" 2>&1 ||
      { bad "$model with $isa did not train"; cat "$tmp/out"; }
  done
  [ "$isas" = base ] && continue
  a=$tmp/${model}_base/step_00000004/shard_00000.bin
  b=$tmp/${model}_avx2/step_00000004/shard_00000.bin
  [ -s "$a" ] && cmp -s "$a" "$b" && ok "$model: base and avx2 give the same bits" ||
    bad "$model: base and avx2 checkpoints differ"
done

finish kernels_isa
