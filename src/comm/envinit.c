/* LOOM_INIT=env://: ranks started without an MPI launcher (a shell loop,
 * Kubernetes, `loom run --nnodes`) form one MPI world from torchrun's
 * variables MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (LOCAL_RANK is
 * informative).
 *
 * 1. Before MPI_Init, a TCP rendezvous: rank 0 listens on MASTER_PORT, the
 *    others connect (retrying until LOOM_RDZV_TIMEOUT) and say their rank,
 *    world size and host; rank 0 checks them (sizes agree, every rank once)
 *    and answers with what MPI needs.
 * 2. Open MPI's singletons reach each other only through a shared PMIx
 *    server: rank 0 starts `ompi-server` and hands its URI to everyone
 *    (OMPI_MCA_pmix_server_uri, set before MPI_Init).
 * 3. Each process starts MPI alone, then the world grows in log2(N) rounds
 *    of MPI_Comm_accept / MPI_Comm_connect and MPI_Intercomm_merge: in round
 *    k the group of ranks [g, g+2^k) accepts the group [g+2^k, g+2^(k+1)) on
 *    a port its leader opened (one port a round; the port table goes
 *    through rank 0's sockets); a split by RANK fixes the order.
 * Processes joined this way are not "local" to each other for Open MPI
 * (MPI_COMM_TYPE_SHARED gives one rank), so backend_mpi.c finds a host's
 * ranks by host name; loom's own shared-memory path works as usual.
 * Open MPI only: MPICH 4.0's ch4:ucx build has no MPI_Open_port. */
#include "internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HELLO "LOOM-RDZV1"

static struct {
  int rank, size, port;
  char addr[256];
  double deadline;
  int secs;       /* LOOM_RDZV_TIMEOUT (loom run --rdzv-timeout) */
  int *fds;       /* rank 0: [size] sockets of the others */
  int master;     /* the others: socket to rank 0 */
  pid_t server;   /* rank 0: ompi-server */
  char dir[128];  /* rank 0: the server's URI and log */
  char sdir[512]; /* this process's Open MPI session base (made here) */
  pthread_t guard;
  bool guarding;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
} E = {.master = -1,
       .server = -1,
       .mu = PTHREAD_MUTEX_INITIALIZER,
       .cv = PTHREAD_COND_INITIALIZER};

bool loom_envinit_wanted(void) {
  const char *v = getenv("LOOM_INIT");
  return v && *v;
}

static double now(void) { return loom_time_now(); }

static loom_status env_int(const char *name, int lo, int hi, bool need,
                           int dflt, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) {
    if (need)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "LOOM_INIT=env:// needs %s in the environment "
                        "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)",
                        name);
    *out = dflt;
    return LOOM_OK;
  }
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (end == v || *end || errno || x < lo || x > hi)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "LOOM_INIT=env://: %s='%s' is not a whole number from "
                      "%d to %d",
                      name, v, lo, hi);
  *out = (int)x;
  return LOOM_OK;
}

loom_status loom_envinit_read(int *rank, int *size) {
  const char *v = getenv("LOOM_INIT");
  if (!v || strcmp(v, "env://") != 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "LOOM_INIT='%s': the one method is env:// (MASTER_ADDR, "
                      "MASTER_PORT, RANK, WORLD_SIZE)",
                      v ? v : "");
  int secs = 0;
  LOOM_TRY(env_int("WORLD_SIZE", 1, 1 << 20, true, 1, &E.size));
  LOOM_TRY(env_int("RANK", 0, E.size - 1, true, 0, &E.rank));
  LOOM_TRY(env_int("MASTER_PORT", 1, 65535, false, 29500, &E.port));
  LOOM_TRY(env_int("LOOM_RDZV_TIMEOUT", 1, 86400, false, 300, &secs));
  const char *a = getenv("MASTER_ADDR");
  if (E.size > 1 && (!a || !*a))
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "LOOM_INIT=env:// needs MASTER_ADDR (rank 0's host "
                      "name or address) in the environment");
  snprintf(E.addr, sizeof E.addr, "%s", a ? a : "127.0.0.1");
  E.deadline = now() + secs;
  E.secs = secs;
  *rank = E.rank;
  *size = E.size;
  return LOOM_OK;
}

#ifdef LOOM_HAVE_MPI

static int left_ms(void) {
  double r = E.deadline - now();
  return r <= 0 ? 0 : (int)(r * 1000) + 1;
}

#include <mpi.h>

/* ---------------------------------------------------------- messages */

static int io_all(int fd, void *buf, size_t n, bool rd) {
  char *p = buf;
  while (n) {
    struct pollfd pf = {fd, rd ? POLLIN : POLLOUT, 0};
    int ms = left_ms();
    if (ms == 0)
      return -ETIMEDOUT;
    int pr = poll(&pf, 1, ms);
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      return pr < 0 ? -errno : -ETIMEDOUT;
    ssize_t k = rd ? read(fd, p, n) : send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (k <= 0)
      return k < 0 ? -errno : -ECONNRESET;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int send_msg(int fd, const void *b, uint32_t n) {
  uint32_t be = htonl(n);
  int rc = io_all(fd, &be, 4, false);
  return rc ? rc : io_all(fd, (void *)(uintptr_t)b, n, false);
}

/* A message of at most cap-1 bytes, NUL-terminated. */
static int recv_msg(int fd, char *b, uint32_t cap, uint32_t *n) {
  uint32_t be;
  int rc = io_all(fd, &be, 4, true);
  if (rc)
    return rc;
  *n = ntohl(be);
  if (*n >= cap)
    return -EMSGSIZE;
  rc = io_all(fd, b, *n, true);
  b[*n] = '\0';
  return rc;
}

static const char *why(int rc) {
  return rc == -ETIMEDOUT ? "timed out (LOOM_RDZV_TIMEOUT)" : strerror(-rc);
}

/* -------------------------------------------------------- rendezvous */

/* Why a port in use may be taken: one inside the kernel's ephemeral range
 * can be held by any connecting socket or MPI listener on this host, now
 * and on restart. hint: that, with the range, or "" when the port lies
 * outside it (or the range cannot be read). */
static void ephemeral_hint(char *hint, size_t n) {
  char line[64];
  hint[0] = '\0';
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (!f)
    return;
  char *end = line;
  long lo = fgets(line, sizeof line, f) ? strtol(line, &end, 10) : 0;
  long hi = end != line ? strtol(end, NULL, 10) : 0;
  fclose(f);
  if (lo > 0 && E.port >= lo && E.port <= hi)
    snprintf(hint, n,
             " (it lies in this host's ephemeral range %ld-%ld, from which "
             "outgoing connections take their ports: choose one below %ld, "
             "such as 29500)",
             lo, hi, lo);
}

static loom_status listen_master(int *out) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)E.port),
                          .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      listen(fd, 1024) < 0) {
    int e = errno;
    if (fd >= 0)
      close(fd);
    char hint[200] = "";
    if (e == EADDRINUSE)
      ephemeral_hint(hint, sizeof hint);
    return loom_error(LOOM_ERR_IO,
                      "env://: rank 0 cannot listen on MASTER_PORT %d: %s%s",
                      E.port, strerror(e), hint);
  }
  *out = fd;
  return LOOM_OK;
}

static int try_connect(const struct addrinfo *ai) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -1;
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc < 0 && errno == EINPROGRESS) {
    struct pollfd pf = {fd, POLLOUT, 0};
    int ms = left_ms() < 2000 ? left_ms() : 2000;
    int err = ETIMEDOUT;
    socklen_t l = sizeof err;
    if (poll(&pf, 1, ms) == 1)
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
    rc = err ? -1 : 0;
    errno = err;
  }
  if (rc < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

static loom_status connect_master(void) {
  char ps[16];
  snprintf(ps, sizeof ps, "%d", E.port);
  char last[160] = "no attempt";
  while (left_ms() > 0) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(E.addr, ps, &hints, &ai);
    if (g == 0) {
      E.master = try_connect(ai);
      if (E.master < 0)
        snprintf(last, sizeof last, "%s", strerror(errno));
      freeaddrinfo(ai);
      if (E.master >= 0)
        return LOOM_OK;
    } else {
      snprintf(last, sizeof last, "%s", gai_strerror(g));
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL); /* the master may not be up yet: retry */
  }
  return loom_error(LOOM_ERR_TIMEOUT,
                    "env://: rank %d cannot reach the master %s:%d within "
                    "%d s (LOOM_RDZV_TIMEOUT, loom run --rdzv-timeout; "
                    "last: %s)",
                    E.rank, E.addr, E.port, E.secs, last);
}

/* Rank 0's directory for the server: itself and its two files, nothing
 * else (the fs helper removes without following links). */
static bool server_own(const char *name, bool is_dir, int depth, void *ctx) {
  (void)ctx;
  if (depth == 0)
    return is_dir && strncmp(name, "loom-rdzv-", 10) == 0;
  return depth == 1 && !is_dir &&
         (strcmp(name, "uri") == 0 || strcmp(name, "ompi-server.log") == 0);
}

static void remove_dir(void) {
  if (!E.dir[0])
    return;
  char *slash = strrchr(E.dir, '/');
  if (slash) {
    *slash = '\0';
    int dfd = loom_fs_open_dir(E.dir[0] ? E.dir : "/");
    *slash = '/';
    if (dfd >= 0) {
      loom_fs_remove_own(dfd, slash + 1, E.dir, server_own, NULL, NULL);
      close(dfd);
    }
  }
  E.dir[0] = '\0';
}

/* Rank 0: ompi-server, whose URI every process needs before MPI_Init. */
static loom_status start_server(char *uri, size_t cap) {
  const char *tmp = getenv("TMPDIR");
  snprintf(E.dir, sizeof E.dir, "%s/loom-rdzv-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(E.dir)) {
    E.dir[0] = '\0';
    return loom_error(LOOM_ERR_IO, "env://: a directory for ompi-server: %s",
                      strerror(errno));
  }
  char file[192], log[192];
  snprintf(file, sizeof file, "%s/uri", E.dir);
  snprintf(log, sizeof log, "%s/ompi-server.log", E.dir);
  pid_t parent = getpid();
  E.server = fork();
  if (E.server == 0) {
    /* The trainer blocks its stop signals for a thread to take them; the
     * server must not inherit that. It dies with rank 0's thread that
     * started it, however that ends. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      _exit(0);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) { /* never the launcher's pipes: it would wait on them */
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", file,
           (char *)NULL);
    _exit(127);
  }
  if (E.server < 0)
    return loom_error(LOOM_ERR_IO, "env://: fork: %s", strerror(errno));
  while (left_ms() > 0) {
    FILE *f = fopen(file, "r");
    bool got = false;
    if (f) {
      got = fgets(uri, (int)cap, f) && strlen(uri) > 5;
      fclose(f);
    }
    if (got) {
      uri[strcspn(uri, "\n")] = '\0';
      /* Read: the files can go now (the server keeps its log open), so a
       * rank 0 killed later leaves nothing behind. */
      remove_dir();
      return LOOM_OK;
    }
    int st;
    if (waitpid(E.server, &st, WNOHANG) == E.server) {
      E.server = -1;
      char said[512] = "";
      FILE *lf = fopen(log, "r");
      if (lf) {
        size_t k = fread(said, 1, sizeof said - 1, lf);
        said[k] = '\0';
        fclose(lf);
      }
      for (char *c = said; *c; c++)
        if (*c == '\n')
          *c = ' ';
      return loom_error(LOOM_ERR_IO,
                        "env://: ompi-server (Open MPI's, needed to join "
                        "ranks started without mpirun) exited at start: %s",
                        said[0] ? said : "(it said nothing)");
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL); /* polling a file the server writes */
  }
  return loom_error(LOOM_ERR_TIMEOUT, "env://: ompi-server gave no URI");
}

/* "LOOM-RDZV1 RANK WORLD" */
static bool parse_hello(const char *m, int *rank, int *world) {
  size_t h = strlen(HELLO);
  if (strncmp(m, HELLO " ", h + 1) != 0)
    return false;
  char *end = NULL;
  errno = 0;
  long r = strtol(m + h + 1, &end, 10);
  if (end == m + h + 1 || *end != ' ' || errno || r < 0 || r > 1 << 24)
    return false;
  const char *w0 = end + 1;
  long w = strtol(w0, &end, 10);
  if (end == w0 || *end != '\0' || errno || w < 1 || w > 1 << 24)
    return false;
  *rank = (int)r;
  *world = (int)w;
  return true;
}

/* Rank 0: every other rank's hello, checked. */
static loom_status gather_hellos(void) {
  int lfd = -1;
  LOOM_TRY(listen_master(&lfd));
  loom_status s = LOOM_OK;
  char buf[512];
  for (int got = 1; got < E.size && s == LOOM_OK;) {
    struct pollfd pf = {lfd, POLLIN, 0};
    int pr = left_ms() == 0 ? 0 : poll(&pf, 1, left_ms());
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0) {
      char missing[200] = "";
      for (int i = 1, n = 0; i < E.size && n < 20; i++)
        if (E.fds[i] < 0)
          n++, snprintf(missing + strlen(missing),
                        sizeof missing - strlen(missing), " %d", i);
      s = loom_error(LOOM_ERR_TIMEOUT,
                     "env://: %d of %d ranks joined at port %d within "
                     "%d s (LOOM_RDZV_TIMEOUT, loom run --rdzv-timeout); "
                     "missing:%s",
                     got, E.size, E.port, E.secs, missing);
      break;
    }
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
      continue;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    uint32_t n;
    int r = -1, ws = -1;
    if (recv_msg(fd, buf, sizeof buf, &n) != 0 || !parse_hello(buf, &r, &ws)) {
      close(fd); /* not one of ours: a scanner, a stale job */
      continue;
    }
    if (ws != E.size || r <= 0 || r >= E.size || E.fds[r] >= 0) {
      snprintf(buf, sizeof buf, "refused: rank %d of WORLD_SIZE %d %s", r, ws,
               ws != E.size ? "does not match the master's world"
                            : "is out of range or came twice");
      send_msg(fd, buf, (uint32_t)strlen(buf));
      close(fd);
      s = loom_error(LOOM_ERR_MISMATCH,
                     "env://: a process said rank %d of %d; "
                     "the master has WORLD_SIZE %d%s",
                     r, ws, E.size,
                     r > 0 && r < E.size && E.fds[r] >= 0 ? " (twice)" : "");
      break;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    E.fds[r] = fd;
    got++;
  }
  close(lfd);
  return s;
}

loom_status loom_envinit_before_mpi(void) {
  if (E.size < 2)
    return LOOM_OK;
  char msg[2048];
  uint32_t n;
  if (E.rank == 0) {
    E.fds = loom_calloc((size_t)E.size, sizeof *E.fds);
    if (!E.fds)
      return LOOM_ERR_NOMEM;
    for (int i = 0; i < E.size; i++)
      E.fds[i] = -1;
    char uri[1024];
    LOOM_TRY(start_server(uri, sizeof uri));
    LOOM_TRY(gather_hellos());
    snprintf(msg, sizeof msg, "OK %s", uri);
    for (int i = 1; i < E.size; i++)
      if (send_msg(E.fds[i], msg, (uint32_t)strlen(msg)) != 0)
        return loom_error(LOOM_ERR_IO,
                          "env://: rank %d left during the "
                          "rendezvous",
                          i);
    setenv("OMPI_MCA_pmix_server_uri", uri, 1);
  } else {
    LOOM_TRY(connect_master());
    int one = 1;
    setsockopt(E.master, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    snprintf(msg, sizeof msg, HELLO " %d %d", E.rank, E.size);
    int rc = send_msg(E.master, msg, (uint32_t)strlen(msg));
    if (rc == 0)
      rc = recv_msg(E.master, msg, sizeof msg, &n);
    if (rc != 0)
      return loom_error(LOOM_ERR_IO,
                        "env://: rank %d waiting for the master %s:%d: %s",
                        E.rank, E.addr, E.port, why(rc));
    if (strncmp(msg, "OK ", 3) != 0)
      return loom_error(LOOM_ERR_MISMATCH, "env://: the master %s:%d: %s",
                        E.addr, E.port, msg);
    setenv("OMPI_MCA_pmix_server_uri", msg + 3, 1);
  }
  /* Each process a session directory tree of its own: a singleton's
   * MPI_Init starts a daemon that makes $TMPDIR/ompi.HOST.UID/..., which
   * the other singletons of the host share and one of them may be
   * removing while another makes its part ("orte_session_dir failed ...
   * Unable to start a daemon on the local node", seen under load). After
   * the server's start: it keeps the default. */
  if (!getenv("OMPI_MCA_orte_tmpdir_base")) {
    const char *tmp = getenv("TMPDIR");
    snprintf(E.sdir, sizeof E.sdir, "%s/loom-ompi-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(E.sdir))
      setenv("OMPI_MCA_orte_tmpdir_base", E.sdir, 1);
    else
      E.sdir[0] = '\0';
  }
  /* Everyone is here: the world's wiring gets a whole timeout of its own
   * (ranks that came late, an image pulled slowly, spent the first). */
  int secs = 300;
  env_int("LOOM_RDZV_TIMEOUT", 1, 86400, false, 300, &secs);
  E.deadline = now() + secs;
  if (getuid() == 0) { /* Open MPI's singleton daemon refuses root else */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  return LOOM_OK;
}

/* A process whose peer died inside MPI_Comm_accept/connect would wait
 * forever: past the deadline, say so and end the process, as the comm
 * watchdog does. */
static void *guard_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&E.mu);
  while (!E.done) {
    struct timespec ts;
    double d = E.deadline + 30;
    ts.tv_sec = (time_t)d;
    ts.tv_nsec = (long)((d - (double)ts.tv_sec) * 1e9);
    /* loom_time_now is CLOCK_MONOTONIC: the condition uses it too */
    if (pthread_cond_timedwait(&E.cv, &E.mu, &ts) == ETIMEDOUT && !E.done) {
      pthread_mutex_unlock(&E.mu);
      LOOM_LOG_ERROR("env://: rank %d: the world did not form within "
                     "LOOM_RDZV_TIMEOUT + 30 s (a rank died while joining?); "
                     "exiting with %d",
                     E.rank, LOOM_COMM_EXIT_TIMEOUT);
      if (E.server > 0)
        kill(E.server, SIGTERM);
      _exit(LOOM_COMM_EXIT_TIMEOUT);
    }
  }
  pthread_mutex_unlock(&E.mu);
  return NULL;
}

static void guard(bool on) {
  if (on) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_destroy(&E.cv);
    pthread_cond_init(&E.cv, &ca);
    pthread_condattr_destroy(&ca);
    E.done = false;
    E.guarding = pthread_create(&E.guard, NULL, guard_main, NULL) == 0;
    return;
  }
  if (!E.guarding)
    return;
  pthread_mutex_lock(&E.mu);
  E.done = true;
  pthread_cond_signal(&E.cv);
  pthread_mutex_unlock(&E.mu);
  pthread_join(E.guard, NULL);
  E.guarding = false;
}

static loom_status mpi_fail(int rc, const char *what) {
  char m[MPI_MAX_ERROR_STRING];
  int l = 0;
  if (MPI_Error_string(rc, m, &l) != MPI_SUCCESS)
    snprintf(m, sizeof m, "MPI error %d", rc);
  return loom_error(LOOM_ERR_REMOTE, "env://: %s: %s", what, m);
}

/* The port table: ports[r][k] of rank r for round k, through rank 0. */
static loom_status share_ports(char *ports, const char *mine, int rounds) {
  size_t P = MPI_MAX_PORT_NAME, row = (size_t)rounds * P;
  size_t all = (size_t)E.size * row;
  if (all > 0x7fffffff)
    return loom_error(LOOM_ERR_UNSUPPORTED, "env://: too many ranks");
  int rc = 0;
  if (E.rank == 0) {
    memcpy(ports, mine, row);
    for (int r = 1; r < E.size && !rc; r++) {
      uint32_t be = 0;
      rc = io_all(E.fds[r], &be, 4, true);
      if (!rc && ntohl(be) != row)
        rc = -EPROTO;
      if (!rc)
        rc = io_all(E.fds[r], ports + (size_t)r * row, row, true);
    }
    for (int r = 1; r < E.size && !rc; r++)
      rc = send_msg(E.fds[r], ports, (uint32_t)all);
  } else {
    rc = send_msg(E.master, mine, (uint32_t)row);
    uint32_t be = 0;
    if (!rc)
      rc = io_all(E.master, &be, 4, true);
    if (!rc && ntohl(be) != all)
      rc = -EPROTO;
    if (!rc)
      rc = io_all(E.master, ports, all, true);
  }
  return rc ? loom_error(LOOM_ERR_IO,
                         "env://: rank %d exchanging MPI ports: %s", E.rank,
                         why(rc))
            : LOOM_OK;
}

static loom_status grow(MPI_Comm *out) {
  int rounds = 0;
  while ((1 << rounds) < E.size)
    rounds++;
  size_t P = MPI_MAX_PORT_NAME;
  char *mine = loom_calloc((size_t)rounds, P);
  char *ports = loom_calloc((size_t)E.size * (size_t)rounds, P);
  loom_status s = mine && ports ? LOOM_OK : LOOM_ERR_NOMEM;
  /* One port a round: a port that two rounds share can hang. */
  for (int k = 0; k < rounds && s == LOOM_OK; k++)
    if (E.rank % (2 << k) == 0 && E.rank + (1 << k) < E.size) {
      int rc = MPI_Open_port(MPI_INFO_NULL, mine + (size_t)k * P);
      if (rc != MPI_SUCCESS)
        s = mpi_fail(rc, "MPI_Open_port");
    }
  if (s == LOOM_OK)
    s = share_ports(ports, mine, rounds);
  MPI_Comm cur = MPI_COMM_SELF;
  for (int k = 0; k < rounds && s == LOOM_OK; k++) {
    int d = 1 << k, g = E.rank - E.rank % (2 * d), partner = g + d;
    if (partner >= E.size)
      continue;
    const char *port = ports + ((size_t)g * (size_t)rounds + (size_t)k) * P;
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    bool low = E.rank < partner;
    int rc = low ? MPI_Comm_accept(port, MPI_INFO_NULL, 0, cur, &inter)
                 : MPI_Comm_connect(port, MPI_INFO_NULL, 0, cur, &inter);
    if (rc == MPI_SUCCESS)
      rc = MPI_Intercomm_merge(inter, low ? 0 : 1, &merged);
    if (inter != MPI_COMM_NULL)
      MPI_Comm_free(&inter);
    if (rc != MPI_SUCCESS) {
      s = mpi_fail(rc, low ? "MPI_Comm_accept" : "MPI_Comm_connect");
      break;
    }
    if (cur != MPI_COMM_SELF)
      MPI_Comm_free(&cur);
    cur = merged;
  }
  for (int k = 0; mine && k < rounds; k++)
    if (mine[(size_t)k * P])
      MPI_Close_port(mine + (size_t)k * P);
  loom_free(mine);
  loom_free(ports);
  if (s == LOOM_OK) {
    int rc = MPI_Comm_split(cur, 0, E.rank, out);
    if (rc != MPI_SUCCESS)
      s = mpi_fail(rc, "MPI_Comm_split");
  }
  if (cur != MPI_COMM_SELF)
    MPI_Comm_free(&cur);
  return s;
}

loom_status loom_envinit_world(void *out_comm) {
  MPI_Comm *out = out_comm;
  if (E.size < 2)
    return loom_error(LOOM_ERR_INTERNAL, "env://: one rank needs no world");
  guard(true);
  loom_status s = grow(out);
  guard(false);
  /* The sockets' work is done. */
  if (E.rank == 0)
    for (int i = 1; i < E.size; i++)
      if (E.fds[i] >= 0)
        close(E.fds[i]);
  loom_free(E.fds);
  E.fds = NULL;
  if (E.master >= 0)
    close(E.master);
  E.master = -1;
  return s;
}

/* The rendezvous sockets, when the world did not form. */
static void close_sockets(void) {
  for (int i = 1; E.fds && i < E.size; i++)
    if (E.fds[i] >= 0)
      close(E.fds[i]); /* the others hear the master is gone at once */
  loom_free(E.fds);
  E.fds = NULL;
  if (E.master >= 0)
    close(E.master);
  E.master = -1;
}

/* Removes the session base once it is empty. A singleton's MPI_Init forks
 * an "orted" that removes the session tree only when this process has
 * exited (it watches a pipe for that), so a small process of its own
 * (double-forked, holding only the parent directory's descriptor) tries
 * loom_fs_remove_empty_dir every 10 ms for 10 s: it succeeds once the
 * daemon has cleaned up, and never removes anything but the empty
 * directory this process made. */
static void remove_session_base(void) {
  if (!E.sdir[0])
    return;
  char *slash = strrchr(E.sdir, '/');
  int dfd = -1;
  if (slash) {
    *slash = '\0';
    dfd = loom_fs_open_dir(E.sdir[0] ? E.sdir : "/");
    *slash = '/';
  }
  const char *name = slash ? slash + 1 : E.sdir;
  if (dfd >= 0 && loom_fs_remove_empty_dir(dfd, name) != 0 &&
      errno == ENOTEMPTY) {
    pid_t c = fork();
    if (c == 0) {
      if (fork() != 0)
        _exit(0);
      /* async-signal-safe calls only: this process had threads */
      long most = sysconf(_SC_OPEN_MAX);
      for (int fd = 0; fd < (most > 0 && most < 65536 ? most : 1024); fd++)
        if (fd != dfd)
          close(fd);
      struct timespec ts = {0, 10 * 1000 * 1000};
      for (int i = 0; i < 1000 && loom_fs_remove_empty_dir(dfd, name) != 0 &&
                      errno == ENOTEMPTY;
           i++)
        nanosleep(&ts, NULL); /* polling the daemon's clean-up */
      _exit(0);
    }
    if (c > 0)
      waitpid(c, NULL, 0);
  }
  if (dfd >= 0)
    close(dfd);
  E.sdir[0] = '\0';
}

void loom_envinit_finish(void) {
  close_sockets();
  if (E.server > 0) { /* SIGTERM, then SIGKILL after 5 s */
    kill(E.server, SIGTERM);
    double until = now() + 5;
    while (waitpid(E.server, NULL, WNOHANG) == 0) {
      if (now() > until) {
        kill(E.server, SIGKILL);
        waitpid(E.server, NULL, 0);
        break;
      }
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL); /* polling the child's exit */
    }
    E.server = -1;
  }
  remove_dir();
  remove_session_base();
}

#endif /* LOOM_HAVE_MPI */
