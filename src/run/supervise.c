/* loom run: starts N ranks through mpirun (Open MPI), mpiexec (MPICH) or
 * srun (inside a SLURM allocation), or runs the program directly for -n 1,
 * with what users trip on handled (root, more ranks than cores, binding,
 * threads per rank, the environment), and supervises the group: signals
 * stop every rank, the exit code is the first failing rank's, and a failed
 * group can be started again (--max-restarts) with LOOM_RESTART_COUNT set.
 * Through the ranks' run status files (LOOM_RUN_DIR) it knows which rank
 * failed first and how, stops the others at once, times the recovery, and
 * writes it all to --report; --min-np/--max-np restart on what the hostfile
 * offers at that moment. */
#define _GNU_SOURCE /* renameat2 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hostfile.h"
#include "internal.h"
#include "loom/comm.h"
#include "loom/config.h"
#include "loom/core.h"
#include "loom/obs.h"
#include "loom/run.h"

extern char **environ;

#define LAUNCHER_LIST(X)                                                       \
  X(LAUNCH_AUTO, "auto")                                                       \
  X(LAUNCH_MPIRUN, "mpirun")                                                   \
  X(LAUNCH_SRUN, "srun")                                                       \
  X(LAUNCH_DIRECT, "direct")                                                   \
  X(LAUNCH_ENV, "env")

typedef enum {
#define X_ENUM(name, text) name,
  LAUNCHER_LIST(X_ENUM)
#undef X_ENUM
      LAUNCH_COUNT
} launcher;

static const char *const launcher_names[] = {
#define X_NAME(name, text) text,
    LAUNCHER_LIST(X_NAME)
#undef X_NAME
};
_Static_assert(sizeof launcher_names / sizeof launcher_names[0] == LAUNCH_COUNT,
               "launcher names");

/* The hidden first argument of `loom run` that makes it the launcher of
 * one host's ranks under --nnodes (envspawn.c). */
#define ENV_RANKS "--env-ranks"
int loom_run_env_ranks(int argc, char **argv);

/* Which MPI the library was built against: its launcher must match, or
 * every rank starts as a singleton. */
typedef enum { MPI_NONE, MPI_OPENMPI, MPI_MPICH } mpi_impl;

static mpi_impl built_mpi(void) {
  const char *m = loom_comm_mpi_impl();
  if (strcmp(m, "openmpi") == 0)
    return MPI_OPENMPI;
  if (strcmp(m, "mpich") == 0)
    return MPI_MPICH;
  return MPI_NONE;
}

typedef struct run_opts {
  int np;            /* 0: decide */
  const char *hosts; /* "h1:s1,h2:s2" */
  const char *hostfile;
  launcher launch;
  const char *mpirun; /* launcher binary override */
  int threads;        /* 0: cores / ranks on this host */
  int max_restarts;
  int min_np, max_np; /* elastic bounds (0: none) */
  const char *report; /* JSON lines of the supervision events */
  int standby;        /* -1 auto, 0 off, 1 on */
  double restart_delay;
  double timeout;
  double stop_grace;   /* seconds to finish the step and save after a stop */
  double hang_timeout; /* no step for this long is a hang (0: derived) */
  bool dry_run;
  bool verbose;
  /* torchrun's start: this host's ranks join the others through env://. */
  int nnodes, node_rank, nproc; /* nnodes 0: not this way */
  const char *master_addr;
  int master_port;
  int rdzv_timeout; /* seconds; 0: LOOM_RDZV_TIMEOUT or its default */
  char **prog;      /* program and its arguments */
} run_opts;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: loom run [options] [--] PROGRAM [ARGS...]\n\n"
      "Starts PROGRAM as N ranks: through mpirun (or srun inside a SLURM "
      "allocation),\nor directly when N is 1.\n\n"
      "  -n, --np N             number of ranks (default: the slots of "
      "--hosts/--hostfile,\n"
      "                         SLURM_NTASKS in an allocation, else 1)\n"
      "      --hosts H:S,...    hosts and their slots, e.g. "
      "node1:2,node2:2\n"
      "      --hostfile FILE    hosts, one per line: 'host slots=S' or "
      "'host:S' (re-read\n"
      "                         on every restart)\n"
      "      --launcher L       auto, mpirun, srun or direct (default "
      "auto)\n"
      "      --mpirun CMD       the mpirun / mpiexec to use (default: the "
      "one matching\n"
      "                         loom's MPI; or LOOM_MPIRUN)\n"
      "      --threads T        threads per rank (default: cores / ranks "
      "on the host)\n"
      "      --max-restarts K   start the whole group again after a "
      "failure, up to K\n"
      "                         times (default 0)\n"
      "      --restart-delay S  seconds before a restart (default 1)\n"
      "      --min-np A         with --hostfile: fail rather than (re)start on "
      "fewer\n"
      "                         than A slots\n"
      "      --max-np B         with --hostfile: start at most B ranks "
      "(np = min(slots, B))\n"
      "      --report FILE      write the supervision events (start, "
      "failure, restart,\n"
      "                         recovered, end) as JSON lines\n"
      "      --standby M        auto, on or off: with restarts left, start "
      "the next group\n"
      "                         ahead of a failure, waiting at its "
      "communication set-up\n"
      "                         (auto: for loom train with every rank on "
      "this host)\n"
      "      --timeout S        stop the job after S seconds (exit code "
      "124)\n"
      "      --stop-grace S     after a stop (a signal, --timeout), the "
      "seconds the ranks\n"
      "                         get to finish their step and save "
      "(default 30)\n"
      "      --hang-timeout S   a rank that completes no step for S "
      "seconds has hung: the\n"
      "                         job is stopped and restarted like after "
      "a crash (default\n"
      "                         max(60, 20 x the median step time))\n"
      "      --nnodes N         torchrun's start, without mpirun: N hosts, "
      "each running\n"
      "                         loom run with the same flags and its own "
      "--node-rank;\n"
      "                         the ranks meet at the master through "
      "LOOM_INIT=env://\n"
      "      --node-rank K      this host, 0 .. N-1 (its ranks are K x L "
      ".. K x L + L-1)\n"
      "      --nproc-per-node L ranks on this host (default 1)\n"
      "      --master-addr A    the host of rank 0, reachable from every "
      "host\n"
      "      --master-port P    a free TCP port there (default 29500)\n"
      "      --rdzv-timeout S   a rank that has not met the others in S "
      "seconds gives up,\n"
      "                         naming what it waited for (default 300; "
      "LOOM_RDZV_TIMEOUT)\n"
      "      --dry-run          print what would run\n"
      "  -v, --verbose          print the launch command, and show the MPI "
      "launcher's\n"
      "                         messages on the console too (without -v, those "
      "of\n"
      "                         loom train go to RUN/logs/launcher.log "
      "only)\n\n"
      "Each rank gets LOOM_THREADS, OMP_NUM_THREADS and "
      "OPENBLAS_NUM_THREADS (unless\nset), LOOM_RESTART_COUNT and the "
      "rest of the environment. Ctrl-C or SIGTERM\nstops every rank; "
      "the exit code is the first failing rank's (%d: the\n"
      "communication watchdog fired). Exit code 2 (a configuration or "
      "command-line\nerror) is never restarted.\n",
      LOOM_COMM_EXIT_TIMEOUT);
}

static int parse_int(const char *s, const char *what, int lo, int *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || end == s || *end || errno || v < lo || v > 1000000) {
    fprintf(stderr, "loom run: %s expects an integer >= %d, got '%s'\n", what,
            lo, s ? s : "");
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int parse_secs(const char *s, const char *what, double *out) {
  char *end;
  double v = s ? strtod(s, &end) : -1;
  if (!s || end == s || *end || v < 0) {
    fprintf(stderr, "loom run: %s expects seconds >= 0, got '%s'\n", what,
            s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv, run_opts *o) {
  memset(o, 0, sizeof *o);
  o->restart_delay = 1.0;
  o->stop_grace = 30.0;
  o->standby = -1;
  o->master_port = 29500;
  bool node_rank_set = false;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-')
      break;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 1;
    }
    if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
      o->verbose = true;
      continue;
    }
    if (strcmp(a, "--dry-run") == 0) {
      o->dry_run = true;
      continue;
    }
    /* Everything else takes a value. */
    if (!v) {
      fprintf(stderr, "loom run: %s needs a value\n", a);
      return -1;
    }
    i++;
    if (strcmp(a, "--nnodes") == 0) {
      if (parse_int(v, "--nnodes", 1, &o->nnodes))
        return -1;
    } else if (strcmp(a, "--node-rank") == 0 || strcmp(a, "--node_rank") == 0) {
      if (parse_int(v, "--node-rank", 0, &o->node_rank))
        return -1;
      node_rank_set = true;
    } else if (strcmp(a, "--nproc-per-node") == 0 ||
               strcmp(a, "--nproc_per_node") == 0) {
      if (parse_int(v, "--nproc-per-node", 1, &o->nproc))
        return -1;
    } else if (strcmp(a, "--master-addr") == 0 ||
               strcmp(a, "--master_addr") == 0) {
      o->master_addr = v;
    } else if (strcmp(a, "--master-port") == 0 ||
               strcmp(a, "--master_port") == 0) {
      if (parse_int(v, "--master-port", 1, &o->master_port) ||
          o->master_port > 65535) {
        fprintf(stderr, "loom run: --master-port is a TCP port, 1-65535\n");
        return -1;
      }
    } else if (strcmp(a, "--rdzv-timeout") == 0 ||
               strcmp(a, "--rdzv_timeout") == 0) {
      if (parse_int(v, "--rdzv-timeout", 1, &o->rdzv_timeout) ||
          o->rdzv_timeout > 86400) {
        fprintf(stderr, "loom run: --rdzv-timeout is 1-86400 seconds\n");
        return -1;
      }
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "-np") == 0 ||
               strcmp(a, "--np") == 0) {
      if (parse_int(v, "-n", 1, &o->np))
        return -1;
    } else if (strcmp(a, "--hosts") == 0 || strcmp(a, "--host") == 0) {
      o->hosts = v;
    } else if (strcmp(a, "--hostfile") == 0) {
      o->hostfile = v;
    } else if (strcmp(a, "--launcher") == 0) {
      int k = 0;
      while (k < LAUNCH_COUNT && strcmp(v, launcher_names[k]) != 0)
        k++;
      if (k == LAUNCH_COUNT) {
        fprintf(stderr,
                "loom run: unknown launcher '%s' (auto, mpirun, srun "
                "or direct)\n",
                v);
        return -1;
      }
      o->launch = (launcher)k;
    } else if (strcmp(a, "--mpirun") == 0) {
      o->mpirun = v;
    } else if (strcmp(a, "--threads") == 0) {
      if (parse_int(v, "--threads", 1, &o->threads))
        return -1;
    } else if (strcmp(a, "--max-restarts") == 0) {
      if (parse_int(v, "--max-restarts", 0, &o->max_restarts))
        return -1;
    } else if (strcmp(a, "--min-np") == 0) {
      if (parse_int(v, "--min-np", 1, &o->min_np))
        return -1;
    } else if (strcmp(a, "--max-np") == 0) {
      if (parse_int(v, "--max-np", 1, &o->max_np))
        return -1;
    } else if (strcmp(a, "--report") == 0) {
      o->report = v;
    } else if (strcmp(a, "--standby") == 0) {
      if (strcmp(v, "auto") == 0)
        o->standby = -1;
      else if (strcmp(v, "on") == 0)
        o->standby = 1;
      else if (strcmp(v, "off") == 0)
        o->standby = 0;
      else {
        fprintf(stderr, "loom run: --standby takes auto, on or off, not '%s'\n",
                v);
        return -1;
      }
    } else if (strcmp(a, "--restart-delay") == 0) {
      if (parse_secs(v, "--restart-delay", &o->restart_delay))
        return -1;
    } else if (strcmp(a, "--timeout") == 0) {
      if (parse_secs(v, "--timeout", &o->timeout))
        return -1;
    } else if (strcmp(a, "--hang-timeout") == 0) {
      if (parse_secs(v, "--hang-timeout", &o->hang_timeout))
        return -1;
    } else if (strcmp(a, "--stop-grace") == 0) {
      if (parse_secs(v, "--stop-grace", &o->stop_grace))
        return -1;
    } else {
      fprintf(stderr, "loom run: unknown option '%s' (see loom run --help)\n",
              a);
      return -1;
    }
  }
  if (i >= argc) {
    fprintf(stderr, "loom run: no program given (see loom run --help)\n");
    return -1;
  }
  if (o->hosts && o->hostfile) {
    fprintf(stderr, "loom run: give --hosts or --hostfile, not both\n");
    return -1;
  }
  if (o->min_np || o->max_np) {
    if (!o->hosts && !o->hostfile) {
      fprintf(stderr, "loom run: --min-np and --max-np need --hostfile (or "
                      "--hosts)\n");
      return -1;
    }
    if (o->np) {
      fprintf(stderr, "loom run: give -n or --min-np/--max-np, not both\n");
      return -1;
    }
    if (o->max_np && o->min_np > o->max_np) {
      fprintf(stderr, "loom run: --min-np %d is above --max-np %d\n", o->min_np,
              o->max_np);
      return -1;
    }
  }
  if (o->nnodes || node_rank_set || o->nproc || o->master_addr ||
      o->rdzv_timeout) {
    if (!o->nnodes) {
      fprintf(stderr, "loom run: --node-rank, --nproc-per-node, "
                      "--master-addr and --rdzv-timeout go with --nnodes\n");
      return -1;
    }
    if (o->np || o->hosts || o->hostfile || o->min_np || o->max_np ||
        (o->launch != LAUNCH_AUTO && o->launch != LAUNCH_ENV)) {
      fprintf(stderr, "loom run: --nnodes starts this host's ranks itself: "
                      "not with -n, --hosts, --hostfile, --min-np, --max-np "
                      "or --launcher\n");
      return -1;
    }
    if (!node_rank_set && o->nnodes > 1) {
      fprintf(stderr,
              "loom run: --nnodes %d needs --node-rank (this host, "
              "0 .. %d)\n",
              o->nnodes, o->nnodes - 1);
      return -1;
    }
    if (o->node_rank >= o->nnodes) {
      fprintf(stderr, "loom run: --node-rank %d is not below --nnodes %d\n",
              o->node_rank, o->nnodes);
      return -1;
    }
    if (!o->master_addr && o->nnodes > 1) {
      fprintf(stderr,
              "loom run: --nnodes %d needs --master-addr (the host "
              "of --node-rank 0)\n",
              o->nnodes);
      return -1;
    }
    if (!o->nproc)
      o->nproc = 1;
    if (!o->master_addr)
      o->master_addr = "127.0.0.1";
    if (o->rdzv_timeout) { /* the ranks read it (comm/envinit.c) */
      char t[32];
      snprintf(t, sizeof t, "%d", o->rdzv_timeout);
      setenv("LOOM_RDZV_TIMEOUT", t, 1);
    }
    o->launch = LAUNCH_ENV;
  } else if (o->launch == LAUNCH_ENV) {
    fprintf(stderr, "loom run: --launcher env goes with --nnodes\n");
    return -1;
  }
  o->prog = argv + i;
  return 0;
}

/* ------------------------------------------------------------ the plan */

#define MAX_HOSTS 4096

typedef struct host_slots {
  int n;
  int slots[MAX_HOSTS];
  char *names; /* "h1:s1,h2:s2": the list in hydra's -hosts form */
} host_slots;

/* Appends "name:slots" to hs->names. */
static int add_host(host_slots *hs, const char *name, size_t len, int slots) {
  size_t old = hs->names ? strlen(hs->names) : 0;
  char *n = realloc(hs->names, old + len + 24);
  if (!n)
    return -1;
  hs->names = n;
  snprintf(n + old, len + 24, "%s%.*s:%d", old ? "," : "", (int)len, name,
           slots);
  hs->slots[hs->n++] = slots;
  return 0;
}

/* "h1:2,h2,h3:4" -> slots per host (1 when not given). */
static int parse_hosts(const char *s, host_slots *hs) {
  hs->n = 0;
  const char *p = s;
  while (*p && hs->n < MAX_HOSTS) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *colon = memchr(p, ':', len);
    int slots = 1;
    if (colon) {
      char num[16] = "";
      size_t k = len - (size_t)(colon + 1 - p);
      if (k == 0 || k >= sizeof num) {
        fprintf(stderr, "loom run: bad host entry '%.*s'\n", (int)len, p);
        return -1;
      }
      memcpy(num, colon + 1, k);
      if (parse_int(num, "host slots", 1, &slots))
        return -1;
      if (slots > LOOM_HOSTFILE_MAX_SLOTS) {
        fprintf(stderr, "loom run: host '%.*s': at most %d slots per host\n",
                (int)len, p, LOOM_HOSTFILE_MAX_SLOTS);
        return -1;
      }
    }
    if (len && add_host(hs, p, colon ? (size_t)(colon - p) : len, slots))
      return -1;
    p = end ? end + 1 : p + len;
  }
  if (hs->n == 0) {
    fprintf(stderr, "loom run: no hosts in '%s'\n", s);
    return -1;
  }
  return 0;
}

static int add_host_cb(void *ctx, const char *name, size_t len, int slots) {
  return add_host(ctx, name, len, slots);
}

/* Hostfiles are parsed strictly (src/run/hostfile.c). */
static int read_hostfile(const char *path, host_slots *hs) {
  hs->n = 0;
  if (loom_hostfile_read(path, add_host_cb, hs) != LOOM_OK) {
    fprintf(stderr, "loom run: %s\n", loom_last_error());
    return -1;
  }
  return 0;
}

/* Ranks per host when np ranks fill the slots in order and the rest are
 * spread round-robin (mpirun's by-slot mapping). */
static void place_ranks(const host_slots *hs, int np, int *placed) {
  int left = np;
  for (int h = 0; h < hs->n; h++) {
    placed[h] = hs->slots[h] < left ? hs->slots[h] : left;
    left -= placed[h];
  }
  for (int h = 0; left > 0; h = (h + 1) % hs->n, left--)
    placed[h]++;
}

/* The most ranks any host gets. */
static int max_ranks_per_host(const host_slots *hs, int np) {
  static int placed[MAX_HOSTS];
  place_ranks(hs, np, placed);
  int m = 1;
  for (int h = 0; h < hs->n; h++)
    if (placed[h] > m)
      m = placed[h];
  return m;
}

/* Whether a host name means this machine. */
static bool is_local_host(const char *name, size_t len) {
  char me[256] = "";
  gethostname(me, sizeof me - 1);
  size_t ml = strlen(me);
  char *dot = strchr(me, '.');
  size_t short_len = dot ? (size_t)(dot - me) : ml;
  return (len == 9 && strncmp(name, "localhost", 9) == 0) ||
         (len == 9 && strncmp(name, "127.0.0.1", 9) == 0) ||
         (len == ml && strncmp(name, me, len) == 0) ||
         (len == short_len && strncmp(name, me, len) == 0);
}

/* Ranks placed on this machine; sets *all_local when no other host has any. */
static int local_ranks(const host_slots *hs, int np, bool *all_local) {
  static int placed[MAX_HOSTS];
  place_ranks(hs, np, placed);
  int n = 0;
  *all_local = true;
  const char *p = hs->names;
  for (int h = 0; h < hs->n && p && *p; h++) {
    const char *colon = strchr(p, ':');
    if (!colon)
      break;
    if (is_local_host(p, (size_t)(colon - p)))
      n += placed[h];
    else if (placed[h] > 0)
      *all_local = false;
    const char *comma = strchr(colon, ',');
    p = comma ? comma + 1 : NULL;
  }
  return n;
}

/* --min-np (elastic): before each start, every other host is asked to run
 * `true` through mpirun's agent (OMPI_MCA_plm_rsh_agent, else ssh in batch
 * mode); a host that does not answer within 15 s is left out of this start
 * while the others still offer --min-np slots, and asked again at the next
 * start (a host that came back is taken in). */
static const char *g_hosts_live; /* the hosts left, for mpirun's --host */
/* The job's directory for Open MPI's shared-memory segments on one host
 * ("" when none could be made): see open_job. */
static char g_shmdir[4096];
static bool g_no_probe; /* planning a standby: no asking */

static bool host_answers(const char *host) {
  const char *agent = getenv("OMPI_MCA_plm_rsh_agent");
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", agent && *agent ? agent : "ssh");
  buf[strcspn(buf, ":")] = '\0'; /* "ssh : rsh": the first */
  char *argv[24];
  int n = 0;
  for (char *t = strtok(buf, " \t"); t && n < 16; t = strtok(NULL, " \t"))
    argv[n++] = t;
  if (n == 0)
    return true;
  /* mpirun's own extra arguments for its agent (e.g. "-p 2222 -i KEY"),
   * placed as Open MPI places them: after the agent, before the host. */
  char extra[512];
  const char *ra = getenv("OMPI_MCA_plm_rsh_args");
  snprintf(extra, sizeof extra, "%s", ra ? ra : "");
  for (char *t = strtok(extra, " \t"); t && n < 16; t = strtok(NULL, " \t"))
    argv[n++] = t;
  const char *base = strrchr(argv[0], '/');
  base = base ? base + 1 : argv[0];
  if (strcmp(base, "ssh") == 0) {
    static char o1[] = "-o", b[] = "BatchMode=yes", o2[] = "-o",
                c[] = "ConnectTimeout=10";
    argv[n++] = o1;
    argv[n++] = b;
    argv[n++] = o2;
    argv[n++] = c;
  }
  static char t[] = "true";
  argv[n++] = (char *)(uintptr_t)host;
  argv[n++] = t;
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      dup2(fd, 0);
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execvp(argv[0], argv);
    _exit(127);
  }
  if (pid < 0)
    return true; /* cannot ask: let mpirun try */
  double until = loom_time_now() + 15;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (loom_time_now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return false;
    }
    loom_run_sleep(0.05); /* polling the probe's exit */
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Leaves the hosts that do not answer out of hs; 0, or -1 (no memory). */
static int drop_silent_hosts(host_slots *hs) {
  static char *live;
  free(live);
  live = NULL;
  g_hosts_live = NULL;
  host_slots keep = {0};
  const char *p = hs->names;
  int dropped = 0;
  for (int h = 0; h < hs->n && p && *p; h++) {
    const char *colon = strchr(p, ':');
    if (!colon)
      break;
    size_t len = (size_t)(colon - p);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)len, p);
    if (is_local_host(p, len) || host_answers(name)) {
      if (add_host(&keep, p, len, hs->slots[h])) {
        free(keep.names);
        return -1;
      }
    } else {
      fprintf(stderr,
              "loom run: host %s does not answer (its agent could not run "
              "`true` there): left out of this start\n",
              name);
      dropped++;
    }
    const char *comma = strchr(colon, ',');
    p = comma ? comma + 1 : NULL;
  }
  if (!dropped) {
    free(keep.names);
    return 0;
  }
  if (keep.n == 0) {
    fprintf(stderr, "loom run: no host of the hostfile answers\n");
    free(keep.names);
    return -1;
  }
  live = keep.names ? strdup(keep.names) : NULL;
  free(hs->names);
  *hs = keep;
  g_hosts_live = live;
  return 0;
}

static bool in_path(const char *name) {
  const char *path = getenv("PATH");
  if (!path || strchr(name, '/'))
    return access(name, X_OK) == 0;
  char buf[4096];
  for (const char *p = path; *p;) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len && len + strlen(name) + 2 < sizeof buf) {
      memcpy(buf, p, len);
      buf[len] = '/';
      strcpy(buf + len + 1, name);
      if (access(buf, X_OK) == 0)
        return true;
    }
    p = end ? end + 1 : p + len;
  }
  return false;
}

static const char *default_mpirun(mpi_impl impl) {
  const char *env = getenv("LOOM_MPIRUN");
  if (env && *env)
    return env;
  if (impl == MPI_MPICH)
    return in_path("mpiexec.mpich") ? "mpiexec.mpich" : "mpiexec";
  return in_path("mpirun.openmpi") ? "mpirun.openmpi" : "mpirun";
}

static void set_default(const char *name, const char *value) {
  if (!getenv(name))
    setenv(name, value, 1);
}

/* Variables that describe one process or host and must not be copied to
 * the ranks of other hosts. */
static bool local_only(const char *entry) {
  static const char *const prefixes[] = {
      "OMPI_COMM_", "OMPI_MCA_orte_", "PMI",       "PMIX",
      "SLURM_",     "BASH_FUNC_",     "HOSTNAME=", "PWD=",
      "OLDPWD=",    "SHLVL=",         "_=",        "TERM",
      "DISPLAY=",   "SSH_",           "XDG_",      "LS_COLORS="};
  if (!strchr(entry, '='))
    return true;
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (strncmp(entry, prefixes[i], strlen(prefixes[i])) == 0)
      return true;
  return false;
}

typedef struct argv_buf {
  char **v;
  int n, cap;
} argv_buf;

static int push(argv_buf *a, const char *s) {
  if (a->n + 2 > a->cap) {
    int cap = a->cap ? a->cap * 2 : 64;
    char **v = realloc(a->v, (size_t)cap * sizeof *v);
    if (!v)
      return -1;
    a->v = v;
    a->cap = cap;
  }
  char *d = strdup(s);
  if (!d)
    return -1;
  a->v[a->n++] = d;
  a->v[a->n] = NULL;
  return 0;
}

static void argv_free(argv_buf *a) {
  for (int i = 0; i < a->n; i++)
    free(a->v[i]);
  free(a->v);
  memset(a, 0, sizeof *a);
}

/* What a plan decided: ranks, slots offered, ranks on this machine. */
typedef struct plan_info {
  int np;
  int slots; /* of --hosts/--hostfile, 0 without */
  int local; /* ranks on this machine, 0 when unknown */
} plan_info;

/* A positive integer from the environment (SLURM's counts), else 0. */
static int env_count(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v)
    return 0;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (end == v || errno == ERANGE || n < 1 || n > 1 << 24)
    return 0;
  return (int)n; /* SLURM_CPUS_ON_NODE may read "4(x2)": the leading count */
}

/* Inside a SLURM allocation (sbatch, salloc, or a step of one). */
static bool in_slurm(void) {
  const char *j = getenv("SLURM_JOB_ID");
  return j && *j;
}

/* The allocation's nodes (1 when SLURM does not say). */
static int slurm_nodes(void) {
  int n = env_count("SLURM_NNODES");
  if (n < 1)
    n = env_count("SLURM_JOB_NUM_NODES");
  return n < 1 ? 1 : n;
}

/* The hosts of --hosts or --hostfile into *hs; the number of ranks, within
 * --min-np/--max-np (elastic: as many as the hosts offer now). -1 when
 * there are too few. */
static int plan_ranks(const run_opts *o, host_slots *hs, bool *have_hosts,
                      int *slots) {
  *have_hosts = false;
  *slots = 0;
  if (o->hosts) {
    if (parse_hosts(o->hosts, hs))
      return -1;
    *have_hosts = true;
  } else if (o->hostfile) {
    if (read_hostfile(o->hostfile, hs))
      return -1;
    *have_hosts = true;
  }
  if (o->nnodes)
    return o->nnodes * o->nproc;
  if (*have_hosts && o->min_np && !o->dry_run && !g_no_probe &&
      drop_silent_hosts(hs))
    return -1;
  int np = o->np;
  for (int h = 0; *have_hosts && h < hs->n; h++)
    *slots += hs->slots[h];
  if (np == 0) {
    if (*have_hosts)
      np = *slots;
    else if (in_slurm()) /* srun's own default: one task per node */
      np = env_count("SLURM_NTASKS") > 0 ? env_count("SLURM_NTASKS")
                                         : slurm_nodes();
    if (np <= 0)
      np = 1;
  }
  if (o->max_np && np > o->max_np)
    np = o->max_np;
  if (o->min_np && np < o->min_np) {
    fprintf(stderr,
            "loom run: %s offers %d slot(s), fewer than --min-np %d; not "
            "starting\n",
            o->hostfile ? o->hostfile : "--hosts", *slots, o->min_np);
    return -1;
  }
  return np;
}

/* auto: one local rank runs directly, inside SLURM srun, else mpirun. */
static launcher choose_launcher(const run_opts *o, int np, bool have_hosts) {
  if (o->launch != LAUNCH_AUTO)
    return o->launch;
  if (np == 1 && !have_hosts)
    return LAUNCH_DIRECT;
  if (in_slurm() && !have_hosts)
    return LAUNCH_SRUN;
  return LAUNCH_MPIRUN;
}

/* Threads per rank: the CPUs SLURM gave each task (SLURM_CPUS_PER_TASK,
 * from --cpus-per-task), else this host's cores shared by the ranks it runs
 * (unless --threads), set for the ranks as LOOM_THREADS, OMP_NUM_THREADS
 * and OPENBLAS_NUM_THREADS; with the attempt and the rank count. Returns
 * the ranks per host and this host's cores. */
static void plan_threads(const run_opts *o, launcher l, const host_slots *hs,
                         bool have_hosts, int np, int attempt, int *per_host,
                         int *cores) {
  /* srun and an mpirun inside an allocation spread the ranks over its
   * nodes (block distribution: at most this many on one). */
  const bool slurm = in_slurm() && !have_hosts;
  *per_host = np;
  if (l == LAUNCH_DIRECT) {
    *per_host = 1;
  } else if (l == LAUNCH_ENV) {
    *per_host = o->nproc;
  } else if (have_hosts) {
    *per_host = max_ranks_per_host(hs, np);
  } else if (slurm) {
    int nodes = slurm_nodes();
    *per_host = (np + nodes - 1) / nodes;
  }
  *cores = loom_cores();
  if (slurm && l != LAUNCH_DIRECT && env_count("SLURM_CPUS_ON_NODE") > 0)
    *cores = env_count("SLURM_CPUS_ON_NODE");
  int threads = *cores / *per_host;
  if (slurm && env_count("SLURM_CPUS_PER_TASK") > 0)
    threads = env_count("SLURM_CPUS_PER_TASK");
  /* A user's LOOM_THREADS sets the BLAS and OpenMP pools too (unless set
   * themselves): 3 loom threads beside 1 OpenMP thread was the surprise. */
  if (env_count("LOOM_THREADS") > 0)
    threads = env_count("LOOM_THREADS");
  if (o->threads)
    threads = o->threads;
  if (threads < 1)
    threads = 1;
  char buf[32];
  snprintf(buf, sizeof buf, "%d", threads);
  set_default("LOOM_THREADS", buf);
  set_default("OMP_NUM_THREADS", buf);
  set_default("OPENBLAS_NUM_THREADS", buf);
  /* A job SLURM requeued (a node failed, preemption, scontrol requeue) is
   * a restart too: its count goes on from SLURM_RESTART_COUNT. */
  snprintf(buf, sizeof buf, "%d",
           attempt + (in_slurm() ? env_count("SLURM_RESTART_COUNT") : 0));
  setenv("LOOM_RESTART_COUNT", buf, 1);
  snprintf(buf, sizeof buf, "%d", np);
  setenv("LOOM_RUN_NP", buf, 1);
}

/* Open MPI's mpirun: root allowed, more ranks than cores allowed, no
 * binding (two jobs on one machine would both pin to the first cores), the
 * hosts, and the environment for ranks on other hosts. */
static void push_openmpi(const run_opts *o, argv_buf *cmd, const char *np,
                         bool have_hosts, bool all_local, int per_host,
                         int cores) {
  if (geteuid() == 0) {
    set_default("OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  /* --oversubscribe makes Open MPI yield in every wait, which costs 10x
   * in bandwidth when ranks do have a core each; yield only when they
   * do not. */
  set_default("OMPI_MCA_mpi_yield_when_idle", per_host > cores ? "1" : "0");
  /* A failed rank takes the job down in ~0.03 s instead of 1 s. */
  set_default("OMPI_MCA_odls_base_sigkill_timeout", "0");
  /* On one host the ob1 PML (over shared memory) is what Open MPI picks
   * anyway; naming it skips probing the others and halves MPI_Init
   * (0.40 s -> 0.22 s for 2 ranks here). Between hosts the choice (UCX on
   * InfiniBand, say) stays Open MPI's. */
  if (all_local)
    set_default("OMPI_MCA_pml", "ob1");
  /* The shared-memory transport's segments (vader_segment.*, 4 MiB each
   * a rank) into the job's own directory, not /dev/shm itself: a launcher
   * killed outright (SIGKILL) leaves them, and there nothing removed them
   * (they are RAM). loom run removes that directory at the end, and the
   * next loom run removes one whose loom run is gone. On one host only: the
   * directory is this host's. Open MPI 5 calls the transport "sm". */
  if (all_local && g_shmdir[0]) {
    set_default("OMPI_MCA_btl_vader_backing_directory", g_shmdir);
    set_default("OMPI_MCA_btl_sm_backing_directory", g_shmdir);
  }
  push(cmd, "--oversubscribe");
  push(cmd, "--bind-to");
  push(cmd, "none");
  push(cmd, "-np");
  push(cmd, np);
  if (g_hosts_live) { /* some hosts did not answer: the others */
    push(cmd, "--host");
    push(cmd, g_hosts_live);
  } else if (o->hosts) {
    push(cmd, "--host");
    push(cmd, o->hosts);
  } else if (o->hostfile) {
    push(cmd, "--hostfile");
    push(cmd, o->hostfile);
  }
  if (have_hosts && !all_local) {
    /* Ranks on other hosts get the environment only through -x. */
    for (char **e = environ; *e; e++) {
      if (local_only(*e))
        continue;
      char name[256];
      size_t k = (size_t)(strchr(*e, '=') - *e);
      if (k >= sizeof name)
        continue;
      memcpy(name, *e, k);
      name[k] = '\0';
      push(cmd, "-x");
      push(cmd, name);
    }
  }
}

/* Builds the command of one attempt and sets the ranks' environment in
 * ours (children inherit it). */
static int build_plan(const run_opts *o, int attempt, argv_buf *cmd,
                      launcher *used, plan_info *pi) {
  static host_slots hs;
  free(hs.names);
  memset(&hs, 0, sizeof hs);
  bool have_hosts;
  int slots;
  const int np = plan_ranks(o, &hs, &have_hosts, &slots);
  if (np < 0)
    return -1;
  const launcher l = choose_launcher(o, np, have_hosts);
  if (l == LAUNCH_DIRECT && np != 1) {
    fprintf(stderr, "loom run: --launcher direct runs one rank, not %d\n", np);
    return -1;
  }
  *used = l;
  bool all_local = !have_hosts;
  pi->np = np;
  pi->slots = slots;
  pi->local = 0;
  if (l == LAUNCH_DIRECT)
    pi->local = np;
  else if (l == LAUNCH_ENV)
    pi->local = o->nproc;
  else if (have_hosts && l == LAUNCH_MPIRUN)
    pi->local = local_ranks(&hs, np, &all_local);
  else if (in_slurm() && slurm_nodes() > 1)
    all_local = false; /* srun or mpirun spread them: how many here? */
  else
    pi->local = np; /* mpirun here, or srun in a one-node allocation */
  int per_host, cores;
  plan_threads(o, l, &hs, have_hosts, np, attempt, &per_host, &cores);
  char nps[32];
  snprintf(nps, sizeof nps, "%d", np);

  mpi_impl impl = built_mpi();
  cmd->n = 0;
  switch (l) {
  case LAUNCH_DIRECT:
    break;
  case LAUNCH_ENV: {
    /* This loom, as the launcher of this host's ranks (env_ranks_main). */
    char self[4096], nums[4][32];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
      fprintf(stderr, "loom run: cannot find its own executable\n");
      return -1;
    }
    self[len] = '\0';
    snprintf(nums[0], sizeof nums[0], "%d", o->nproc);
    snprintf(nums[1], sizeof nums[1], "%d", o->node_rank * o->nproc);
    snprintf(nums[2], sizeof nums[2], "%d", np);
    snprintf(nums[3], sizeof nums[3], "%d", o->master_port);
    const char *args[] = {self,    "run",          ENV_RANKS, nums[0], nums[1],
                          nums[2], o->master_addr, nums[3],   "--"};
    for (size_t k = 0; k < sizeof args / sizeof args[0]; k++)
      push(cmd, args[k]);
    break;
  }
  case LAUNCH_SRUN:
    push(cmd, "srun");
    push(cmd, "-n");
    push(cmd, nps);
    push(cmd, "--kill-on-bad-exit=1");
    /* Open MPI talks PMIx, MPICH PMI-2; the wrong one gives singletons. */
    push(cmd, impl == MPI_MPICH ? "--mpi=pmi2" : "--mpi=pmix");
    /* srun of SLURM 22.05 does not take --cpus-per-task from the
     * allocation (23.11 does again): without it each task is given one
     * CPU, and where tasks are bound to their CPUs the threads share it. */
    if (env_count("SLURM_CPUS_PER_TASK") > 0) {
      char c[48];
      snprintf(c, sizeof c, "--cpus-per-task=%d",
               env_count("SLURM_CPUS_PER_TASK"));
      push(cmd, c);
    }
    break;
  case LAUNCH_MPIRUN: {
    const char *mr = o->mpirun ? o->mpirun : default_mpirun(impl);
    bool hydra =
        impl == MPI_MPICH || strstr(mr, "mpich") || strstr(mr, "hydra");
    push(cmd, mr);
    if (hydra) {
      /* Hydra binds nothing and passes the environment by default; its
       * hostfile syntax differs from Open MPI's, so hosts go as a list. */
      push(cmd, "-n");
      push(cmd, nps);
      if (have_hosts) {
        push(cmd, "-hosts");
        push(cmd, hs.names);
      }
      break;
    }
    push_openmpi(o, cmd, nps, have_hosts, all_local, per_host, cores);
    break;
  }
  default:
    return -1;
  }
  for (char **p = o->prog; *p; p++)
    if (push(cmd, *p))
      return -1;
  return 0;
}

static void describe_failure(const loom_run_result *r, char *buf, size_t n) {
  if (r->code == LOOM_EXIT_HANG)
    snprintf(buf, n, "exit code %d: no progress within the hang timeout",
             r->code);
  else if (r->code == LOOM_COMM_EXIT_TIMEOUT)
    snprintf(buf, n, "exit code %d: the communication watchdog fired", r->code);
  else if (r->signal && r->launcher_killed)
    snprintf(buf, n, "exit code %d: the launcher died from signal %d (%s)",
             r->code, r->signal, loom_signal_name(r->signal));
  else if (r->code > 128 && r->code < 160)
    snprintf(buf, n, "exit code %d: a rank died from signal %d", r->code,
             r->code - 128);
  else if (r->code == 127)
    snprintf(buf, n, "exit code 127: the program could not be started");
  else
    snprintf(buf, n, "exit code %d", r->code);
}

/* ------------------------------------------------------- supervision */

/* The job's state across attempts: the report file, and the failure that
 * the next attempt recovers from. */
typedef struct job {
  const run_opts *o;
  const char *jobdir;
  FILE *report;
  int attempt;
  bool standby_ok;        /* the program waits at the gate (loom train) */
  bool is_train;          /* the program is loom train */
  int standby_attempt;    /* the attempt the standby group was started for */
  char standby_cmd[8192]; /* its launch command, to compare with a new plan */
  bool recovering;        /* the previous attempt failed; time the recovery */
  loom_run_failure fail;  /* that failure (times filled even when no rank was
                             identified: then the launcher's exit) */
  int shm_fd;             /* the lock of g_shmdir's owner file, or -1 */
} job;

static void report_emit(job *jb, cJSON *ev) {
  if (jb->report) {
    char *line = cJSON_PrintUnformatted(ev);
    if (line) {
      fprintf(jb->report, "%s\n", line);
      fflush(jb->report);
      cJSON_free(line);
    }
  }
  cJSON_Delete(ev);
}

static cJSON *report_event(const char *name, int attempt) {
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "event", name);
  cJSON_AddNumberToObject(ev, "attempt", attempt);
  cJSON_AddNumberToObject(ev, "time", loom_time_wall());
  return ev;
}

static void join_cmd(const argv_buf *cmd, char *out, size_t n) {
  size_t k = 0;
  out[0] = '\0';
  for (int i = 0; i < cmd->n && k < n; i++)
    k += (size_t)snprintf(out + k, n - k, "%s%s", i ? " " : "", cmd->v[i]);
}

/* Starts the group of the next attempt now, while this one trains: its
 * ranks start, set up communication and wait at the gate (LOOM_RUN_GATE,
 * see loom_runstat_phase), so that a restart skips the launch. */
static void start_standby(job *jb) {
  const run_opts *o = jb->o;
  int next = jb->attempt + 1;
  char adir[4200], gate[4300];
  snprintf(adir, sizeof adir, "%s/attempt-%d", jb->jobdir, next);
  snprintf(gate, sizeof gate, "%s/go", adir);
  if (mkdir(adir, 0755) != 0 && errno != EEXIST)
    return;
  setenv("LOOM_RUN_DIR", adir, 1);
  setenv("LOOM_RUN_GATE", gate, 1);
  argv_buf cmd = {0};
  launcher used;
  plan_info pi;
  /* Quietly: a hostfile that does not plan now gets its say at restart. */
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved >= 0 && null >= 0)
    dup2(null, STDERR_FILENO);
  g_no_probe = true; /* inside the watch loop: never a 15 s probe there */
  int bad = build_plan(o, next, &cmd, &used, &pi);
  g_no_probe = false;
  fflush(stderr);
  if (saved >= 0) {
    dup2(saved, STDERR_FILENO);
    close(saved);
  }
  if (null >= 0)
    close(null);
  if (!bad && pi.local == pi.np && used != LAUNCH_SRUN) {
    join_cmd(&cmd, jb->standby_cmd, sizeof jb->standby_cmd);
    pid_t pid = loom_run_start(cmd.v, false);
    if (pid > 0) {
      loom_run_standby_set(pid);
      jb->standby_attempt = next;
      cJSON *ev = report_event("standby", next);
      cJSON_AddNumberToObject(ev, "np", pi.np);
      cJSON_AddNumberToObject(ev, "pid", pid);
      report_emit(jb, ev);
    }
  }
  unsetenv("LOOM_RUN_GATE");
  argv_free(&cmd);
}

/* Called when every local rank of an attempt completed its first step:
 * after a restart, the recovery, in parts that add up to the total
 * (docs/run.md); then the standby group for the next failure. */
static void on_recovered(void *ctx, const loom_run_progress *p) {
  job *jb = ctx;
  if (jb->standby_ok && jb->attempt < jb->o->max_restarts &&
      jb->standby_attempt <= jb->attempt)
    start_standby(jb);
  if (!jb->recovering)
    return;
  jb->recovering = false;
  const loom_run_failure *f = &jb->fail;
  /* A phase a program does not record counts with the one after it. */
  double cr = p->t_comm_ready > 0 ? p->t_comm_ready : p->t_spawn;
  double ld = p->t_loaded > 0 ? p->t_loaded : cr;
  double detect = f->t_detect - f->t_fail, stop = f->t_stopped - f->t_detect;
  double delay = p->t_spawn - f->t_stopped, start = cr - p->t_spawn;
  double load = ld - cr, first = p->t_first_step - ld;
  double total = p->t_first_step - f->t_fail;
  fprintf(stderr,
          "loom run: recovered in %.2f s (detect %.2f, stop %.2f, delay "
          "%.2f, start %.2f, load %.2f, first step %.2f) at step %lld\n",
          total, detect, stop, delay, start, load, first,
          (long long)p->first_step);
  cJSON *ev = report_event("recovered", jb->attempt);
  cJSON_AddNumberToObject(ev, "step", (double)p->first_step);
  cJSON_AddNumberToObject(ev, "ranks", p->ranks);
  cJSON_AddNumberToObject(ev, "total_s", total);
  cJSON_AddNumberToObject(ev, "detect_s", detect);
  cJSON_AddNumberToObject(ev, "stop_s", stop);
  cJSON_AddNumberToObject(ev, "delay_s", delay);
  cJSON_AddNumberToObject(ev, "start_s", start);
  cJSON_AddNumberToObject(ev, "load_s", load);
  cJSON_AddNumberToObject(ev, "first_step_s", first);
  cJSON_AddNumberToObject(ev, "t_fail", f->t_fail);
  cJSON_AddNumberToObject(ev, "t_detect", f->t_detect);
  cJSON_AddNumberToObject(ev, "t_stopped", f->t_stopped);
  cJSON_AddNumberToObject(ev, "t_spawn", p->t_spawn);
  /* Finer marks for a closer look (0 when the program records none):
   * the last rank's process started; its training loop began. */
  cJSON_AddNumberToObject(ev, "t_exec", p->t_exec);
  cJSON_AddNumberToObject(ev, "t_comm_ready", p->t_comm_ready);
  cJSON_AddNumberToObject(ev, "t_loaded", p->t_loaded);
  cJSON_AddNumberToObject(ev, "t_training", p->t_training);
  cJSON_AddNumberToObject(ev, "t_first_step", p->t_first_step);
  report_emit(jb, ev);
}

/* The exit code loom run reports for a failed attempt: the failing rank's
 * own when a local rank was identified, else the launcher's. */
static int failure_code(const loom_run_failure *f, const loom_run_result *r) {
  if (f->found && f->signal > 0)
    return 128 + f->signal;
  if (f->found && f->code > 0)
    return f->code;
  return r->code;
}

/* One line: which rank, where, how, when, and how fast the rest stopped. */
static void describe_rank_failure(const loom_run_failure *f,
                                  const loom_run_result *r, int np, char *buf,
                                  size_t n) {
  size_t k = 0;
#define OUT(...)                                                               \
  do {                                                                         \
    if (k < n)                                                                 \
      k += (size_t)snprintf(buf + k, n - k, __VA_ARGS__);                      \
  } while (0)
  if (f->hang) {
    /* Every rank still in the job waits for the slowest one in a collective,
     * so all stall at about the same step: the one whose last step is
     * oldest is named first. */
    OUT("no progress for %.1f s (hang timeout %.0f s) on rank(s) %d (step "
        "%lld)%s%s; rank %d (host %s, pid %d) stopped first",
        f->idle_s, f->hang_timeout, f->rank, (long long)f->last_step,
        f->stalled[0] ? ", " : "", f->stalled, f->rank, f->host, f->pid);
    if (np > 1)
      OUT("; stopped the other %d rank(s) in %.2f s", np - 1,
          f->t_stopped - f->t_detect);
    return;
  }
  if (f->watchdog)
    OUT("the communication watchdog fired on rank %d (host %s, pid %d)",
        f->rank, f->host, f->pid);
  else
    OUT("rank %d (host %s, pid %d)", f->rank, f->host, f->pid);
  int sig = f->signal;
  if (!sig && !f->recorded && r->code > 128 && r->code < 160)
    sig = r->code - 128; /* the launcher saw it die */
  if (f->watchdog)
    ;
  else if (sig)
    OUT(" died from signal %d (%s)", sig, loom_signal_name(sig));
  else if (f->code >= 0)
    OUT(" exited with code %d", f->code);
  else
    OUT(" died without an exit record (killed from outside: SIGKILL, the "
        "OOM killer?)");
  if (f->last_step >= 0)
    OUT(" after step %lld", (long long)f->last_step);
  else
    OUT(" before its first step");
  if (f->note[0])
    OUT(f->watchdog ? ": %s" : " (%s)", f->note);
  if (np > 1)
    OUT("; stopped the other %d rank(s) in %.2f s", np - 1,
        f->t_stopped - f->t_detect);
#undef OUT
}

/* 128 + the signal the ranks named, else the launcher's code. */
static int stop_code(const loom_run_stop *st, int code) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    if (strcmp(st->by, loom_signal_name(sigs[i])) == 0)
      return 128 + sigs[i];
  return code;
}

/* How a stop ended: "stopped by SIGTERM at step N, checkpoint saved". */
static void describe_stop(const loom_run_result *r, const loom_run_stop *st) {
  char by[64];
  if (r->timed_out)
    snprintf(by, sizeof by, "the time limit");
  else if (r->stopped_by)
    snprintf(by, sizeof by, "%s", loom_signal_name(r->stopped_by));
  else
    snprintf(by, sizeof by, "%s sent to the ranks",
             st->by[0] ? st->by : "a signal");
  if (st->stopped > 0 && st->stopped == st->ranks && !st->steps_differ)
    fprintf(stderr, "loom run: stopped by %s at step %lld, %s (after %.1f s)\n",
            by, (long long)st->step,
            st->saved == st->ranks ? "checkpoint saved" : "no checkpoint saved",
            r->seconds);
  else if (st->stopped > 0)
    fprintf(stderr,
            "loom run: stopped by %s after %.1f s; %d of %d rank(s) stopped "
            "at a step%s\n",
            by, r->seconds, st->stopped, st->ranks,
            st->steps_differ ? " (not the same step)" : "");
  else
    fprintf(stderr, "loom run: job stopped by %s after %.1f s\n", by,
            r->seconds);
}

/* The first line when the launcher itself was killed. */
static void describe_launcher_death(const loom_run_result *r, const char *name,
                                    int np) {
  fprintf(stderr,
          "loom run: the launcher died: %s (pid %d) was killed by signal %d "
          "(%s); its %d rank(s) were stopped\n",
          name, (int)r->launcher_pid, r->signal, loom_signal_name(r->signal),
          np);
}

static void report_failure(job *jb, const loom_run_failure *f, int np, int code,
                           const char *why) {
  cJSON *ev = report_event("failure", jb->attempt);
  cJSON_AddNumberToObject(ev, "np", np);
  cJSON_AddNumberToObject(ev, "code", code);
  cJSON_AddStringToObject(ev, "why", why);
  cJSON_AddBoolToObject(ev, "rank_known", f->found);
  if (f->found) {
    cJSON_AddNumberToObject(ev, "rank", f->rank);
    cJSON_AddStringToObject(ev, "host", f->host);
    cJSON_AddNumberToObject(ev, "pid", f->pid);
    if (f->code >= 0)
      cJSON_AddNumberToObject(ev, "exit_code", f->code);
    else
      cJSON_AddNullToObject(ev, "exit_code");
    if (f->signal > 0 || (code > 128 && code < 160 && f->code < 0))
      cJSON_AddNumberToObject(ev, "signal",
                              f->signal > 0 ? f->signal : code - 128);
    else
      cJSON_AddNullToObject(ev, "signal");
    cJSON_AddBoolToObject(ev, "recorded", f->recorded);
    cJSON_AddBoolToObject(ev, "watchdog", f->watchdog);
    cJSON_AddBoolToObject(ev, "hang", f->hang);
    cJSON_AddNumberToObject(ev, "last_step", (double)f->last_step);
    cJSON_AddStringToObject(ev, "note", f->note);
  }
  cJSON_AddNumberToObject(ev, "t_fail", f->t_fail);
  cJSON_AddNumberToObject(ev, "t_detect", f->t_detect);
  cJSON_AddNumberToObject(ev, "t_stopped", f->t_stopped);
  cJSON_AddNumberToObject(ev, "detect_s", f->t_detect - f->t_fail);
  cJSON_AddNumberToObject(ev, "stop_s", f->t_stopped - f->t_detect);
  report_emit(jb, ev);
}

/* ------------------------------------------- the job's directory */

/* The names loom run and the ranks write in a job directory: "owner" (the
 * lock held for the job's life), "attempt-N" directories, and inside them
 * "rank-N", its temporary "rank-N.PID" and the gate "go"; in the job's
 * shared-memory directory, "owner" and Open MPI's segments of its ranks
 * ("vader_segment.*", Open MPI 5's "sm_segment.*"). `level`: 0 the job
 * directory itself, 1 its entries, 2 an attempt's. */

/* NAME is PREFIX followed by a decimal number and, when dot, ".NUMBER". */
static bool numbered(const char *name, const char *prefix, bool dot) {
  size_t k = strlen(prefix);
  if (strncmp(name, prefix, k) != 0 || name[k] < '0' || name[k] > '9')
    return false;
  const char *end;
  int64_t v;
  if (!loom_parse_i64_at(name + k, &end, &v))
    return false;
  if (!dot)
    return *end == '\0';
  return end[0] == '.' && end[1] >= '0' && end[1] <= '9' &&
         loom_parse_i64(end + 1, &v);
}

static bool own_name(const char *name, bool is_dir, int level) {
  switch (level) {
  case 0:
    return is_dir;
  case 1:
    if (!is_dir)
      return strcmp(name, "owner") == 0 ||
             strncmp(name, "vader_segment.", 14) == 0 ||
             strncmp(name, "sm_segment.", 11) == 0;
    return numbered(name, "attempt-", false);
  case 2:
    if (is_dir)
      return false;
    return strcmp(name, "go") == 0 || numbered(name, "rank-", false) ||
           numbered(name, "rank-", true);
  default:
    return false;
  }
}

/* loom_fs_remove_own's predicate; ctx: the level of the entry removed (0
 * for a job directory, 1 for an attempt's). */
static bool run_own(const char *name, bool is_dir, int depth, void *ctx) {
  return own_name(name, is_dir, depth + *(const int *)ctx);
}

/* Removes dfd/name, a job directory (level 0) or an attempt's (level 1),
 * link-safely and only loom's names (loom_fs_remove_own); whether all of
 * it went. */
static bool remove_own_tree(int dfd, const char *name, const char *shown,
                            int level) {
  int left = 0;
  return loom_fs_remove_own(dfd, name, shown, run_own, &level, &left) ==
             LOOM_OK &&
         left == 0;
}

/* Removes a job or attempt directory (a path) that loom run made. */
static void remove_dir(const char *path) {
  char parent[4200];
  snprintf(parent, sizeof parent, "%s", path);
  char *slash = strrchr(parent, '/');
  if (!slash || !slash[1])
    return;
  *slash = '\0';
  int dfd = open(parent[0] ? parent : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return;
  bool attempt = strncmp(slash + 1, "attempt-", 8) == 0;
  remove_own_tree(dfd, slash + 1, path, attempt ? 1 : 0);
  close(dfd);
}

typedef struct leftover_scan {
  char want[4200];
  size_t wn;
} leftover_scan;

static bool kill_if_of_job(const char *name, void *ctx) {
  const leftover_scan *ls = ctx;
  static char env[65536];
  int pid;
  if (name[0] < '1' || name[0] > '9' || !loom_parse_int(name, &pid))
    return true;
  char path[64];
  snprintf(path, sizeof path, "/proc/%.20s/environ", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return true;
  ssize_t n = read(fd, env, sizeof env - 1);
  close(fd);
  for (ssize_t i = 0; n > 0 && i < n;) {
    const char *var = env + i;
    size_t len = strnlen(var, (size_t)(n - i));
    if (len >= ls->wn && strncmp(var, ls->want, ls->wn) == 0) {
      kill((pid_t)pid, SIGKILL);
      break;
    }
    i += (ssize_t)len + 1;
  }
  return true;
}

/* Processes of a dead loom run's job still about (a launcher that hung in
 * its teardown after loom run was killed): they carry LOOM_RUN_DIR inside
 * that job's directory in their environment, which no other process can
 * (the directory's name is unique while it exists). SIGKILLed. */
static void kill_job_leftovers(const char *tmp, const char *name) {
  leftover_scan ls;
  int wn = snprintf(ls.want, sizeof ls.want, "LOOM_RUN_DIR=%s/%s/", tmp, name);
  if (wn <= 0 || wn >= (int)sizeof ls.want)
    return;
  ls.wn = (size_t)wn;
  loom_fs_each_entry(AT_FDCWD, "/proc", true, kill_if_of_job, &ls);
}

typedef struct jobdir_scan {
  int dfd;
  const char *tmp;
} jobdir_scan;

/* A job directory is made as loom-new-XXXXXX, its owner file created and
 * locked there, then renamed to loom-run-XXXXXX (make_jobdir): so a
 * loom-run-* whose owner can be locked belongs to no live loom run. One
 * being made, between the owner's creation and its lock, is never seen
 * under that name (before, a loom run starting beside another could lock
 * the other's new owner in that moment, take it for stale and SIGKILL the
 * ranks the other had started meanwhile). A loom-new-* is another's
 * directory being made, unless it is older than a minute (a loom run
 * killed in those few instructions). */
#define JOBDIR_NEW_STALE_S 60

static bool remove_if_stale(const char *name, void *ctx) {
  const jobdir_scan *js = ctx;
  bool made = strncmp(name, "loom-run-", 9) == 0;
  if ((!made && strncmp(name, "loom-new-", 9) != 0) || strlen(name) != 15)
    return true;
  struct stat st;
  if (fstatat(js->dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return true;
  if (!made && time(NULL) - st.st_mtime < JOBDIR_NEW_STALE_S)
    return true;
  int jfd =
      openat(js->dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (jfd < 0)
    return true;
  int ofd = openat(jfd, "owner", O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  close(jfd);
  if (ofd < 0)
    return true; /* not one of ours (or an older loom's): leave it */
  /* held through the clean-up: a live owner cannot have it */
  bool stale = flock(ofd, LOCK_EX | LOCK_NB) == 0;
  char shown[4200];
  snprintf(shown, sizeof shown, "%s/%s", js->tmp, name);
  if (stale)
    kill_job_leftovers(js->tmp, name);
  if (stale && remove_own_tree(js->dfd, name, shown, 0))
    LOOM_INFO("loom run: removed %s/%s of a loom run that is gone", js->tmp,
              name);
  close(ofd);
  return true;
}

/* Job directories of loom runs that died without removing theirs (killed
 * with SIGKILL): a live loom run holds a lock on its "owner" file for the
 * whole job, so one that can be locked belongs to no one. Only
 * loom-run-XXXXXX directories of this user are looked at. */
static void remove_stale_jobdirs(const char *tmp) {
  jobdir_scan js = {open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC), tmp};
  if (js.dfd < 0)
    return;
  loom_fs_each_entry(js.dfd, ".", false, remove_if_stale, &js);
  close(js.dfd);
}

/* Makes a job directory in tmp and takes its lock (held until loom run
 * exits, however it exits); returns the lock's fd, -1 on failure, said on
 * stderr unless quiet. */
static int make_jobdir(const char *tmp, char *jobdir, size_t n, bool quiet) {
  remove_stale_jobdirs(tmp);
  /* made and locked as loom-new-XXXXXX, then renamed (remove_if_stale) */
  char made[4200], owner[4300];
  for (int tries = 0; tries < 100; tries++) {
    snprintf(made, sizeof made, "%s/loom-new-XXXXXX", tmp);
    if (!mkdtemp(made)) {
      if (!quiet)
        fprintf(stderr, "loom run: cannot make a directory in %s: %s\n", tmp,
                strerror(errno));
      return -1;
    }
    snprintf(owner, sizeof owner, "%s/owner", made);
    int fd =
        open(owner, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (!quiet)
        fprintf(stderr, "loom run: cannot lock %s: %s\n", owner,
                strerror(errno));
      if (fd >= 0)
        close(fd);
      remove_dir(made);
      return -1;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (write(fd, pid, (size_t)len) != len) {
      /* the pid is for people; the lock is what counts */
    }
    snprintf(jobdir, n, "%s/loom-run-%s", tmp, made + strlen(made) - 6);
    if (renameat2(AT_FDCWD, made, AT_FDCWD, jobdir, RENAME_NOREPLACE) == 0)
      return fd;
    int e = errno;
    close(fd);
    remove_dir(made);
    if (e != EEXIST) { /* taken: another name */
      if (!quiet)
        fprintf(stderr, "loom run: cannot rename %s to %s: %s\n", made, jobdir,
                strerror(e));
      return -1;
    }
  }
  if (!quiet)
    fprintf(stderr, "loom run: no free loom-run-XXXXXX name in %s\n", tmp);
  return -1;
}

/* The configuration of `loom train CFG [--set ...]` as loom train loads it
 * (allocated: free it), or NULL when the program is something else or the
 * config does not load (loom train will say why). */
static loom_config *train_config(const run_opts *o) {
  const char *base = strrchr(o->prog[0], '/');
  base = base ? base + 1 : o->prog[0];
  if (strcmp(base, "loom") != 0 || !o->prog[1] ||
      strcmp(o->prog[1], "train") != 0)
    return NULL;
  const char *cfg_path = NULL;
  const char *sets[64];
  int n_sets = 0;
  for (int i = 2; o->prog[i]; i++) {
    const char *a = o->prog[i];
    if (strcmp(a, "--set") == 0 && o->prog[i + 1]) {
      if (n_sets < 64)
        sets[n_sets++] = o->prog[i + 1];
      i++;
    } else if (a[0] == '-') {
      /* options with a value */
      if ((strcmp(a, "--resume") == 0 || strcmp(a, "--steps") == 0 ||
           strcmp(a, "--stop-at") == 0) &&
          o->prog[i + 1])
        i++;
    } else if (!cfg_path) {
      cfg_path = a;
    }
  }
  if (!cfg_path)
    return NULL;
  loom_config *cfg = calloc(1, sizeof *cfg);
  if (cfg && loom_config_load(cfg, cfg_path, sets, n_sets) != LOOM_OK) {
    free(cfg);
    cfg = NULL;
  }
  return cfg;
}

/* The launcher's own messages (Open MPI's banners, UCX backtraces) go to
 * RUN/logs/launcher.log, RUN being the run directory of `loom train CFG
 * [--set ...]` (log.run_dir as loom train resolves it). False when the
 * program is something else or the config does not load (loom train will
 * say why). */
static bool run_dir_of(const run_opts *o, char *out, size_t n) {
  loom_config *cfg = train_config(o);
  bool ok = cfg && cfg->log.run_dir[0];
  if (ok)
    snprintf(out, n, "%s/logs/launcher.log", cfg->log.run_dir);
  free(cfg);
  return ok;
}

/* The MLflow run of a job of loom train that ended failed or stopped: its
 * ranks end it themselves (FAILED, KILLED) when they can, but a rank
 * killed outright (SIGKILL, the OOM killer, Open MPI taking the job down
 * after one rank died) cannot, and the run stayed RUNNING on the server
 * for good. After the last attempt loom run ends it (FAILED, or KILLED
 * when the job was stopped) if the server still says RUNNING. The run is
 * the one the ranks wrote into RUN/mlflow_run_id. */
static void end_mlflow_run(const run_opts *o, bool stopped) {
  loom_config *cfg = train_config(o);
  if (!cfg || !cfg->log.mlflow_uri[0] || !cfg->log.run_dir[0]) {
    free(cfg);
    return;
  }
  char id[128];
  bool valid =
      loom_mlflow_read_run_id(cfg->log.run_dir, id, sizeof id) == LOOM_OK &&
      id[0];
  if (valid) {
    const char *status = stopped ? "KILLED" : "FAILED";
    bool ended = false;
    if (loom_mlflow_end_stale(cfg->log.mlflow_uri, id, status, 10, &ended) !=
        LOOM_OK)
      fprintf(stderr, "loom run: %s (it may stay RUNNING)\n",
              loom_last_error());
    else if (ended)
      fprintf(stderr,
              "loom run: MLflow run %s was still RUNNING (its ranks could "
              "not end it): ended as %s\n",
              id, status);
  }
  free(cfg);
}

/* Before the first start: the word "loom" is this loom (found where it
 * is, not through PATH); a program that is not there is said so, not
 * reported as a rank that died (where every rank runs here: another host
 * may have it); the launcher's log is set up. 0, or the exit code. */
static int prepare_program(run_opts *o, char *self, size_t n) {
  if (strcmp(o->prog[0], "loom") == 0) {
    ssize_t len = readlink("/proc/self/exe", self, n - 1);
    if (len > 0) {
      self[len] = '\0';
      o->prog[0] = self;
    }
  }
  if (!o->hosts && !o->hostfile && !o->dry_run && !in_path(o->prog[0])) {
    fprintf(stderr, "loom run: program not found: %s\n", o->prog[0]);
    return 127;
  }
  char launcher_log[4200] = "";
  if (!o->dry_run && run_dir_of(o, launcher_log, sizeof launcher_log))
    loom_run_set_launcher_log(launcher_log, o->verbose);
  return 0;
}

/* An attempt that ended on a stop asked for: by loom run (a signal, its
 * --timeout), or by a signal sent to the ranks directly, every rank then
 * stopped at an agreed step (not restarted; the code is 128 + the signal,
 * whichever rank's exit the launcher passed on). Says so, sets *rc. */
static bool ended_by_stop(const loom_run_result *r, const loom_run_stop *stop,
                          const loom_run_failure *f, int *rc) {
  if (r->stopped_by || r->timed_out) {
    describe_stop(r, stop);
    *rc = r->code;
    return true;
  }
  if (!f->found && stop->stopped > 0 && stop->stopped == stop->ranks) {
    describe_stop(r, stop);
    *rc = stop_code(stop, r->code);
    return true;
  }
  return false;
}

/* Failures a restart would meet again: a configuration or command-line
 * error (2), a full or read-only file system (74). Says so. */
static bool not_restartable(int rc, double seconds) {
  const char *what = rc == LOOM_EXIT_USAGE     ? "a configuration or "
                                                 "command-line error"
                     : rc == LOOM_EXIT_NOSPACE ? "a save found no space or a "
                                                 "read-only file system"
                                               : NULL;
  if (!what)
    return false;
  fprintf(stderr,
          "loom run: job failed (exit code %d: %s) after %.1f s; not "
          "restarted, since it would fail the same way\n",
          rc, what, seconds);
  return true;
}

/* LOOM_RUN_JOB, the same in every attempt: the trainer records it in its
 * checkpoints, and a restart goes on from the newest one it names rather
 * than from what --resume named for the first attempt (which the job's
 * own saves may have pruned since), never from another run's checkpoint
 * in the same directory. Inside SLURM the job's id, which a requeue
 * keeps; elsewhere 64 random bits. */
static void set_job_id(void) {
  char id[64];
  const char *slurm = getenv("SLURM_JOB_ID");
  if (in_slurm() && slurm && *slurm && strlen(slurm) < 32 &&
      strspn(slurm, "0123456789") == strlen(slurm)) {
    snprintf(id, sizeof id, "slurm-%s", slurm);
  } else {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
      r = (uint64_t)time(NULL) << 20 ^ (uint64_t)getpid() ^
          (uint64_t)(loom_time_now() * 1e9);
    snprintf(id, sizeof id, "run-%016llx", (unsigned long long)r);
  }
  setenv("LOOM_RUN_JOB", id, 1);
}

/* The job's shared-memory directory removed (only the names loom run and
 * Open MPI wrote) and its lock let go. */
static void close_shmdir(job *jb) {
  if (g_shmdir[0])
    remove_dir(g_shmdir);
  g_shmdir[0] = '\0';
  if (jb->shm_fd >= 0)
    close(jb->shm_fd);
  jb->shm_fd = -1;
}

/* The job's directory for the ranks' status files (a fresh one per job,
 * one per attempt inside it, all removed at the end), its shared-memory
 * directory and the --report file. 0, or the exit code. */
static int open_job(job *jb, char *jobdir, size_t n, int *owner_fd) {
  const run_opts *o = jb->o;
  *owner_fd = -1;
  if (o->dry_run)
    return 0;
  const char *tmp = getenv("TMPDIR");
  *owner_fd = make_jobdir(tmp && *tmp ? tmp : "/tmp", jobdir, n, false);
  if (*owner_fd < 0)
    return LOOM_EXIT_FAIL;
  /* The shared-memory segments' directory (push_openmpi), made and locked
   * as the job directory is, in LOOM_RUN_SHM (default /dev/shm: RAM, as
   * Open MPI's default); without one Open MPI keeps its default. */
  const char *shm = getenv("LOOM_RUN_SHM");
  shm = shm && *shm ? shm : "/dev/shm";
  struct stat st;
  g_shmdir[0] = '\0';
  jb->shm_fd = -1;
  if (stat(shm, &st) == 0 && S_ISDIR(st.st_mode))
    jb->shm_fd = make_jobdir(shm, g_shmdir, sizeof g_shmdir, true);
  if (jb->shm_fd < 0) { /* not an error: the job runs as before */
    g_shmdir[0] = '\0';
    LOOM_INFO("loom run: no job directory could be made in %s (%s): Open "
              "MPI's shared-memory segments go where it puts them",
              shm, strerror(errno));
  }
  if (o->report) {
    jb->report = fopen(o->report, "w");
    if (!jb->report) {
      fprintf(stderr, "loom run: cannot write %s: %s\n", o->report,
              strerror(errno));
      close_shmdir(jb);
      remove_dir(jobdir);
      close(*owner_fd);
      *owner_fd = -1;
      return LOOM_EXIT_USAGE;
    }
  }
  return 0;
}

/* --dry-run: what would be started, and with which thread settings. */
static void print_plan(launcher used, const argv_buf *cmd) {
  printf("launcher: %s\n", launcher_names[used]);
  printf("command:");
  for (int i = 0; i < cmd->n; i++)
    printf(" %s", cmd->v[i]);
  printf("\nLOOM_THREADS=%s OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s\n",
         getenv("LOOM_THREADS"), getenv("OMP_NUM_THREADS"),
         getenv("OPENBLAS_NUM_THREADS"));
}

/* Whether the standby group takes this attempt: started for it with this
 * very plan (an elastic change of hosts discards it). A discarded one is
 * killed and its ranks' files removed, so they do not pass for the new
 * group's. */
static bool take_standby(job *jb, int attempt, const argv_buf *cmd,
                         const char *adir) {
  bool standby = false;
  if (attempt > 0 && jb->standby_attempt == attempt &&
      loom_run_standby_alive()) {
    char now_cmd[8192];
    join_cmd(cmd, now_cmd, sizeof now_cmd);
    standby = strcmp(now_cmd, jb->standby_cmd) == 0;
  }
  if (!standby) {
    loom_run_standby_kill();
    if (jb->standby_attempt == attempt) {
      remove_dir(adir);
      mkdir(adir, 0755);
    }
  }
  return standby;
}

/* The report's "start" or "restart" event, and the line for a restart on
 * another number of ranks. */
static void report_start(job *jb, int attempt, const plan_info *pi, int prev_np,
                         bool standby) {
  const run_opts *o = jb->o;
  if (attempt > 0 && pi->np != prev_np)
    fprintf(stderr,
            "loom run: restart %d of %d on %d ranks (was %d): %s now has "
            "%d slot(s)\n",
            attempt, o->max_restarts, pi->np, prev_np,
            o->hostfile ? "the hostfile" : "--hosts", pi->slots);
  cJSON *ev = report_event(attempt ? "restart" : "start", attempt);
  cJSON_AddNumberToObject(ev, "np", pi->np);
  if (attempt)
    cJSON_AddNumberToObject(ev, "prev_np", prev_np);
  if (pi->slots)
    cJSON_AddNumberToObject(ev, "slots", pi->slots);
  if (attempt)
    cJSON_AddBoolToObject(ev, "standby", standby);
  report_emit(jb, ev);
}

/* One attempt: the group started (or the standby group's gate opened) and
 * watched until it ends. Fills *r, *stop and *fail; 0, or non-zero when it
 * could not be started. */
static int run_attempt(job *jb, const plan_info *pi, argv_buf *cmd,
                       const char *adir, bool standby, loom_run_result *r,
                       loom_run_stop *stop, loom_run_failure *fail) {
  const run_opts *o = jb->o;
  loom_run_watch w;
  loom_watch_init(&w);
  w.dir = adir;
  w.expect_local = pi->local;
  w.all_local = pi->local == pi->np;
  w.keeps_status = jb->is_train;
  w.hang_timeout = o->hang_timeout;
  w.want_progress = jb->recovering || jb->standby_ok;
  w.on_first_step = on_recovered;
  w.ctx = jb;
  int s;
  if (standby) {
    /* Open the gate: the group's ranks go on from their communication
     * set-up; the recovery's "start" begins now. */
    char gate[4300];
    snprintf(gate, sizeof gate, "%s/go", adir);
    w.prog.t_spawn = loom_time_wall();
    int fd = open(gate, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0)
      close(fd);
    s = loom_run_wait(loom_run_standby_take(), o->timeout, &w, r);
  } else {
    s = loom_run_spawn(cmd->v, o->timeout, o->verbose, &w, r);
  }
  loom_watch_stop_summary(&w, stop);
  *fail = w.fail;
  loom_watch_free(&w);
  return s;
}

/* The launcher's own words on a failure, which went to its log, when no
 * rank's record said why (MPI_Init and the launcher's own failures are told
 * only there; a rank that recorded its end has said it, and the launcher's
 * banners about the ranks it then killed would only mislead): its first
 * lines that read as errors, quoted with the log's path; with none, the
 * path alone. */
static void tell_launcher_said(const loom_run_failure *f) {
  if (f->found && f->recorded)
    return;
  const char *lines[LOOM_RUN_SAID_MAX], *path;
  bool wrote;
  int n = loom_run_launcher_said(lines, &path, &wrote);
  for (int i = 0; i < n; i++)
    if (i == 0)
      fprintf(stderr, "loom run: the launcher said: \"%s\"%s%s%s\n", lines[0],
              n == 1 ? " (" : "", n == 1 ? path : "", n == 1 ? ")" : "");
    else
      fprintf(stderr, "loom run:   \"%s\"%s%s%s\n", lines[i],
              i == n - 1 ? " (" : "", i == n - 1 ? path : "",
              i == n - 1 ? ")" : "");
  if (n == 0 && wrote)
    fprintf(stderr, "loom run: the launcher's messages are in %s\n", path);
}

/* A failed attempt: names the rank (or the launcher) that failed, reports
 * it, and decides. True when the job ends here (*rc its code); false when
 * it restarts, after the restart delay. */
static bool after_failure(job *jb, int attempt, const loom_run_result *r,
                          loom_run_failure f, launcher used, const char *cmd0,
                          const plan_info *pi, int *rc) {
  const run_opts *o = jb->o;
  if (r->launcher_killed && used != LAUNCH_DIRECT) {
    /* mpirun itself died from a signal it did not get from us: the ranks
     * went down with it (or were stopped by loom run), none is to blame. */
    describe_launcher_death(r, cmd0, pi->np);
    f.found = false;
  }
  if (!f.found) {
    /* No local rank told us (remote ranks, a program that keeps no
     * status): the launcher's exit is all there is. */
    double now = loom_time_wall();
    f.t_fail = f.t_detect = f.t_stopped = now;
  }
  *rc = failure_code(&f, r);
  loom_run_result rr = *r;
  rr.code = *rc;
  /* The launcher's death is the reason only when its status is the one
   * reported: not when a rank's record gave the code, nor when the
   * launcher is the rank itself (-n 1: its signal is a rank's). */
  rr.launcher_killed = r->launcher_killed && !f.found && used != LAUNCH_DIRECT;
  char why[160];
  describe_failure(&rr, why, sizeof why);
  if (f.found) {
    char line[1024];
    /* the ranks this job stops: under --nnodes, this host's only */
    describe_rank_failure(&f, r, used == LAUNCH_ENV ? pi->local : pi->np, line,
                          sizeof line);
    fprintf(stderr, "loom run: %s\n", line);
  }
  tell_launcher_said(&f);
  report_failure(jb, &f, pi->np, *rc, why);
  jb->recovering = false;
  if (not_restartable(*rc, r->seconds))
    return true;
  if (attempt >= o->max_restarts) {
    if (o->max_restarts > 0)
      fprintf(stderr,
              "loom run: job failed (%s) after %.1f s; no restart "
              "left (--max-restarts %d)\n",
              why, r->seconds, o->max_restarts);
    else
      fprintf(stderr, "loom run: job failed (%s) after %.1f s\n", why,
              r->seconds);
    return true;
  }
  fprintf(stderr,
          "loom run: job failed (%s) after %.1f s; restart %d of "
          "%d in %g s\n",
          why, r->seconds, attempt + 1, o->max_restarts, o->restart_delay);
  jb->fail = f;
  jb->recovering = true;
  loom_run_sleep(o->restart_delay);
  if (loom_run_stop_requested()) {
    *rc = 128 + 2;
    return true;
  }
  return false;
}

int loom_run_main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], ENV_RANKS) == 0)
    return loom_run_env_ranks(argc - 1, argv + 1);
  run_opts o;
  int pr = parse_args(argc, argv, &o);
  if (pr != 0)
    return pr > 0 ? LOOM_EXIT_OK : LOOM_EXIT_USAGE;
  job jb;
  memset(&jb, 0, sizeof jb);
  jb.o = &o;
  jb.shm_fd = -1;
  /* A standby group must wait at the gate, which loom train does (through
   * loom_runstat_phase); any other program would simply run twice. */
  const char *base = strrchr(o.prog[0], '/');
  base = base ? base + 1 : o.prog[0];
  bool is_train =
      strcmp(base, "loom") == 0 && o.prog[1] && strcmp(o.prog[1], "train") == 0;
  loom_run_set_stop_grace(o.stop_grace);
  char self[4096];
  int bad = prepare_program(&o, self, sizeof self);
  if (bad)
    return bad;
  jb.is_train = is_train;
  jb.standby_ok =
      o.max_restarts > 0 && (o.standby == 1 || (o.standby == -1 && is_train));
  char jobdir[4096] = "";
  int owner_fd;
  bad = open_job(&jb, jobdir, sizeof jobdir, &owner_fd);
  if (bad)
    return bad;
  jb.jobdir = jobdir;
  if (!o.dry_run)
    set_job_id();
  double t_job = loom_time_now();
  int rc = 0, prev_np = 0;
  bool job_stopped = false;
  /* The supervise loop: start the group, wait, classify, maybe again. */
  for (int attempt = 0;; attempt++) {
    jb.attempt = attempt;
    char adir[4200] = "";
    if (!o.dry_run) {
      snprintf(adir, sizeof adir, "%s/attempt-%d", jobdir, attempt);
      mkdir(adir, 0755);
      setenv("LOOM_RUN_DIR", adir, 1);
    }
    argv_buf cmd = {0};
    launcher used;
    plan_info pi;
    if (build_plan(&o, attempt, &cmd, &used, &pi)) {
      loom_run_standby_kill();
      argv_free(&cmd);
      /* A restart that cannot be planned (the hostfile shrank below
       * --min-np) ends the job with the failure it was restarting from. */
      if (attempt == 0)
        rc = LOOM_EXIT_USAGE;
      break;
    }
    if (o.dry_run) {
      print_plan(used, &cmd);
      argv_free(&cmd);
      return LOOM_EXIT_OK;
    }
    bool standby = take_standby(&jb, attempt, &cmd, adir);
    report_start(&jb, attempt, &pi, prev_np, standby);
    prev_np = pi.np;
    loom_run_result r;
    loom_run_stop stop;
    loom_run_failure fail;
    int s = run_attempt(&jb, &pi, &cmd, adir, standby, &r, &stop, &fail);
    char cmd0[256];
    snprintf(cmd0, sizeof cmd0, "%s", cmd.n > 0 ? cmd.v[0] : "?");
    argv_free(&cmd);
    remove_dir(adir);
    if (s != 0) {
      rc = LOOM_EXIT_FAIL;
      break;
    }
    if (r.code == 0) {
      rc = 0;
      break;
    }
    if (ended_by_stop(&r, &stop, &fail, &rc)) {
      job_stopped = true;
      break;
    }
    if (after_failure(&jb, attempt, &r, fail, used, cmd0, &pi, &rc))
      break;
  }
  loom_run_standby_kill();
  if (rc != 0 && is_train)
    end_mlflow_run(&o, job_stopped);
  cJSON *ev = report_event("end", jb.attempt);
  cJSON_AddNumberToObject(ev, "code", rc);
  cJSON_AddNumberToObject(ev, "seconds", loom_time_now() - t_job);
  report_emit(&jb, ev);
  if (jb.report)
    fclose(jb.report);
  close_shmdir(&jb);
  remove_dir(jobdir);
  if (owner_fd >= 0)
    close(owner_fd);
  return rc;
}
