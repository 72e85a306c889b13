# Emulated hosts for the cluster tests, sourced after tests/lib.sh: N
# network namespaces (host1..hostN, addresses 10.79.0.(10+K)/24 on a link
# "lnk0"), joined by a bridge in a switch namespace, each command on a host
# run with its own hostname (a UTS namespace) so that Open MPI and loom see
# distinct hosts; optional tbf rate limits on both directions of every link
# (this kernel has tbf, not netem: rates bind, latency cannot be added).
# Every namespace is named with this test's own prefix and removed at exit;
# nothing is made in the root namespace. Needs root and `ip netns`.
#   hosts_up N [RATE]   make them (RATE like 1gbit; empty: no limit)
#   on_host K CMD...    run CMD on host K (in the foreground)
#   hosts_down          remove them (also at exit)
#   hosts_start N RATE NAME WHY   a test's whole start (below)
#   HOSTS_AGENT         the ssh stand-in for mpirun (tests/cluster/rsh.sh)
HOSTS_PREFIX="lm$(($$ % 100000))"
HOSTS_N=0
HOSTS_AGENT="$SRC/tests/cluster/rsh.sh"
export HOSTS_PREFIX

hosts_can() { # whether namespaces can be made here (root, ip netns)
  [ "$(id -u)" = 0 ] || return 1
  ip netns add "${HOSTS_PREFIX}probe" 2>/dev/null || return 1
  ip netns del "${HOSTS_PREFIX}probe"
}

hosts_down() {
  local i
  for i in $(seq 1 "$HOSTS_N"); do ip netns del "${HOSTS_PREFIX}n$i" 2>/dev/null || true; done
  ip netns del "${HOSTS_PREFIX}sw" 2>/dev/null || true
  HOSTS_N=0
  return 0
}

hosts_up() { # N [RATE]
  local n=$1 rate=${2:-} i sw="${HOSTS_PREFIX}sw"
  ip netns add "$sw" || return 1
  HOSTS_N=$n
  ip -n "$sw" link add br0 type bridge &&
    ip -n "$sw" link set br0 type bridge stp_state 0 forward_delay 0 &&
    ip -n "$sw" link set br0 up || return 1
  for i in $(seq 1 "$n"); do
    local ns="${HOSTS_PREFIX}n$i"
    ip netns add "$ns" &&
      ip link add lnk0 netns "$ns" type veth peer name "p$i" netns "$sw" &&
      ip -n "$ns" addr add "10.79.0.$((10 + i))/24" dev lnk0 &&
      ip -n "$ns" link set lnk0 up && ip -n "$ns" link set lo up &&
      ip -n "$sw" link set "p$i" master br0 && ip -n "$sw" link set "p$i" up || return 1
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc replace dev lnk0 root tbf rate "$rate" burst 256kb latency 20ms &&
        ip netns exec "$sw" tc qdisc replace dev "p$i" root tbf rate "$rate" burst 256kb latency 20ms || return 1
    fi
  done
}

# On the hosts only, Open MPI across them: mpirun starts its daemons on
# hostK through the agent, and every byte between hosts goes over lnk0
# (TCP; shared memory within a host).
on_host() { # K CMD...
  local k=$1
  shift
  ip netns exec "${HOSTS_PREFIX}n$k" unshare --uts -- env OMPI_MCA_plm_rsh_agent="$HOSTS_AGENT" \
    OMPI_MCA_oob_tcp_if_include=lnk0 OMPI_MCA_btl_tcp_if_include=lnk0 \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 \
    /bin/sh -c 'hostname "$0"; exec "$@"' "host$k" "$@"
}

# The start of every emulated-hosts test: one thread a rank, quiet logs,
# Open MPI's own leaks suppressed (ASan), skip (77) without namespaces or
# when loom is not built with Open MPI (WHY says what needs it), removal at
# exit, then N hosts at RATE (NAME: the test, for its summary line).
hosts_start() { # N RATE NAME WHY
  export LOOM_THREADS=1 OMP_NUM_THREADS=1 LOOM_LOG=warn
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/parallel/lsan_mpi.supp:fast_unwind_on_malloc=0:print_suppressions=0}
  hosts_can || { echo "skipped: cannot make network namespaces here (needs root and ip netns)"; exit 77; }
  "$LOOM" run --dry-run -n 2 prog | grep -q '^command: mpirun.openmpi\|^command: [^ ]*ompi\|^command: mpirun ' ||
    { echo "skipped: $4"; exit 77; }
  trap 'hosts_down; rm -rf "$tmp"' EXIT
  hosts_up "$1" "$2" || { bad "making $1 emulated hosts"; finish "$3"; }
}
