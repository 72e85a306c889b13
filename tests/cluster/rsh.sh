#!/bin/sh
# An ssh stand-in for mpirun on the emulated hosts (tests/cluster/hosts.sh):
# "logging in" to hostK or 10.79.0.(10+K) enters that host's network
# namespace with hostname hostK and runs the command string there, as sshd
# would; a host whose link is down does not answer (exit 255, like ssh).
# Options before the host (-x, -o ...) are ignored; with RSH_LOG set, each
# call's arguments are appended to that file.
[ -n "${RSH_LOG:-}" ] && echo "$*" >>"$RSH_LOG"
while [ $# -gt 0 ]; do
  case $1 in
  -o | -p | -l | -i) shift 2 ;;
  -*) shift ;;
  *) break ;;
  esac
done
host=$1
shift
case $host in
host[0-9]*) k=${host#host} ;;
10.79.0.*) k=$((${host##*.} - 10)) ;;
*)
  echo "rsh.sh: unknown host '$host' (expected hostK or 10.79.0.(10+K))" >&2
  exit 255
  ;;
esac
# A host whose link is down cannot be reached, as ssh could not.
ip -n "${HOSTS_PREFIX:?}n$k" link show lnk0 2>/dev/null | grep -q 'state UP' || {
  echo "rsh.sh: host$k: no route to host (its link is down)" >&2
  exit 255
}
exec ip netns exec "${HOSTS_PREFIX:?}n$k" unshare --uts -- /bin/sh -c 'hostname "$0"; eval "$1"' "host$k" "$*"
