/* loom run: watching the local ranks of one attempt through their run status
 * files (LOOM_RUN_DIR) and pidfds: who died first and how, and when the
 * restarted group reached each phase. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/core.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

struct loom_watch_rank {
  int rank;
  bool local;    /* on this host: its pid is ours to watch */
  int pidfd;     /* -1 when none (remote, or pidfd_open failed) */
  bool dead;     /* seen gone */
  double t_seen; /* wall time its death was seen */
  int wstatus;   /* from /proc while it was a zombie; -1 unknown */
  /* The order of events. The kernel closes a process's files when it
   * exits, before its pidfd turns readable: the IN_CLOSE_WRITE of the
   * rank's status file is queued on our inotify in the order the ranks
   * really ended, whenever loom run gets to read it (under load, often
   * after several ranks are gone). end_seq is that order (0: not seen). */
  int64_t end_seq;
  double t_alive;    /* last wall time it was known alive (before a poll) */
  double t_end_read; /* when its end was read (an upper bound of it) */
  bool stopped;      /* loom run signalled it: never the cause */
  bool candidate;    /* among the ends seen when the failure was detected */
  int64_t hb_step;   /* the heartbeat: the step last seen, and its time */
  double hb_t;
  loom_runstat_record rec;
};

const char *loom_signal_name(int sig) {
  switch (sig) {
  case SIGHUP:
    return "SIGHUP";
  case SIGINT:
    return "SIGINT";
  case SIGQUIT:
    return "SIGQUIT";
  case SIGILL:
    return "SIGILL";
  case SIGTRAP:
    return "SIGTRAP";
  case SIGABRT:
    return "SIGABRT";
  case SIGBUS:
    return "SIGBUS";
  case SIGFPE:
    return "SIGFPE";
  case SIGKILL:
    return "SIGKILL";
  case SIGUSR1:
    return "SIGUSR1";
  case SIGSEGV:
    return "SIGSEGV";
  case SIGUSR2:
    return "SIGUSR2";
  case SIGPIPE:
    return "SIGPIPE";
  case SIGALRM:
    return "SIGALRM";
  case SIGTERM:
    return "SIGTERM";
  case SIGXCPU:
    return "SIGXCPU";
  case SIGXFSZ:
    return "SIGXFSZ";
  default:
    return "signal";
  }
}

static bool same_host(const char *h) {
  static char me[256];
  if (!me[0] && gethostname(me, sizeof me - 1) != 0)
    strcpy(me, "?");
  return strcmp(h, me) == 0;
}

void loom_watch_init(loom_run_watch *w) {
  w->ranks = NULL;
  w->n = 0;
  w->cap = 0;
  w->next_scan = 0;
  w->first_step_told = false;
  w->ino = -1;
  w->end_seq = 0;
  w->t_polled = 0;
  w->detected = false;
  w->n_step_s = 0;
  w->all_local = true;
  memset(&w->fail, 0, sizeof w->fail);
  w->fail.rank = -1;
  memset(&w->prog, 0, sizeof w->prog);
  w->prog.first_step = -1;
}

void loom_watch_free(loom_run_watch *w) {
  for (int i = 0; i < w->n; i++)
    if (w->ranks[i].pidfd >= 0)
      close(w->ranks[i].pidfd);
  free(w->ranks);
  if (w->ino >= 0)
    close(w->ino);
  w->ino = -1;
  w->ranks = NULL;
  w->n = w->cap = 0;
}

/* A rank's status file: "rank-N" exactly (not its temporary "rank-N.PID"). */
static bool rank_file(const char *name, int *rank) {
  return strncmp(name, "rank-", 5) == 0 && name[5] >= '0' && name[5] <= '9' &&
         loom_parse_int(name + 5, rank);
}

static loom_watch_rank *find(loom_run_watch *w, int rank) {
  for (int i = 0; i < w->n; i++)
    if (w->ranks[i].rank == rank)
      return &w->ranks[i];
  return NULL;
}

/* The exit status of a zombie, from field 52 of /proc/PID/stat; -1 when the
 * process is gone (reaped) or not a zombie. Its parent (mpirun) reaps it
 * within moments, so this is a best effort that often wins the race. */
static int zombie_status(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ' || p[2] != 'Z')
    return -1;
  /* p + 2 is field 3 (state); field 52 is 49 fields further on. */
  char *tok = p + 2;
  for (int field = 3; field < 52; field++) {
    tok = strchr(tok, ' ');
    if (!tok)
      return -1;
    tok++;
  }
  const char *end;
  int64_t v;
  return loom_parse_i64_at(tok, &end, &v) && v >= 0 && v <= 255 ? (int)v : -1;
}

static void mark_dead(loom_watch_rank *r, double now) {
  if (r->dead)
    return;
  r->dead = true;
  r->t_seen = now;
  r->wstatus = zombie_status(r->rec.pid);
  if (r->pidfd >= 0) {
    close(r->pidfd);
    r->pidfd = -1;
  }
}

/* Reads the record of a known rank again; keeps the old one when the file
 * is being rewritten at this moment. */
static void refresh(loom_run_watch *w, loom_watch_rank *r) {
  loom_runstat_record rec;
  if (loom_runstat_read(w->dir, r->rank, &rec) != LOOM_OK)
    return;
  /* The heartbeat: each step completed moves it, and gives a step time.
   * The first one too, from the end of loading: a model whose steps take
   * over a minute must not be taken for hung right after its first. */
  if (rec.step >= 0 && r->hb_step < 0 && rec.first_step >= 0 &&
      rec.t_first_step > 0 && rec.t_phase[LOOM_RUNSTAT_LOADED] > 0 &&
      rec.t_first_step > rec.t_phase[LOOM_RUNSTAT_LOADED]) {
    int cap = (int)(sizeof w->step_s / sizeof w->step_s[0]);
    w->step_s[w->n_step_s % cap] =
        rec.t_first_step - rec.t_phase[LOOM_RUNSTAT_LOADED];
    w->n_step_s++;
  }
  if (rec.step >= 0 && rec.step != r->hb_step && rec.t_step > 0) {
    if (r->hb_step >= 0 && rec.step > r->hb_step && r->hb_t > 0 &&
        rec.t_step > r->hb_t) {
      double dt = (rec.t_step - r->hb_t) / (double)(rec.step - r->hb_step);
      int cap = (int)(sizeof w->step_s / sizeof w->step_s[0]);
      w->step_s[w->n_step_s % cap] = dt;
      w->n_step_s++;
    }
    r->hb_step = rec.step;
    r->hb_t = rec.t_step;
  }
  r->rec = rec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double loom_watch_hang_timeout(const loom_run_watch *w) {
  if (w->hang_timeout > 0)
    return w->hang_timeout;
  int cap = (int)(sizeof w->step_s / sizeof w->step_s[0]);
  int n = w->n_step_s < cap ? w->n_step_s : cap;
  double t = 60.0;
  if (n > 0) {
    double v[sizeof w->step_s / sizeof w->step_s[0]];
    memcpy(v, w->step_s, (size_t)n * sizeof v[0]);
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    if (20.0 * v[n / 2] > t)
      t = 20.0 * v[n / 2];
  }
  return t;
}

/* A hang: local ranks that completed a step once and none since for
 * longer than the hang timeout (stuck outside a collective, stopped, or
 * waiting for one that is). The cause named is the one that stopped
 * first: the lowest step, then the oldest heartbeat; the others are listed.
 * Returns whether one was found (then w->fail is it). */
static bool find_hang(loom_run_watch *w, double now) {
  double limit = loom_watch_hang_timeout(w);
  int best = -1;
  for (int i = 0; i < w->n; i++) {
    loom_watch_rank *r = &w->ranks[i];
    /* The last sign of life: a step, or a beat (evaluating, saving). */
    double alive = r->rec.t_beat > r->hb_t ? r->rec.t_beat : r->hb_t;
    if (!r->local || r->dead || r->hb_step < 0 || now - alive <= limit ||
        r->rec.phase == LOOM_RUNSTAT_DONE)
      continue;
    if (best < 0 || r->hb_step < w->ranks[best].hb_step ||
        (r->hb_step == w->ranks[best].hb_step && r->hb_t < w->ranks[best].hb_t))
      best = i;
  }
  if (best < 0)
    return false;
  loom_watch_rank *r = &w->ranks[best];
  loom_run_failure *f = &w->fail;
  f->found = true;
  f->hang = true;
  f->hang_timeout = limit;
  f->idle_s = now - (r->rec.t_beat > r->hb_t ? r->rec.t_beat : r->hb_t);
  f->rank = r->rank;
  f->pid = r->rec.pid;
  snprintf(f->host, sizeof f->host, "%s", r->rec.host);
  f->code = LOOM_EXIT_HANG;
  f->signal = 0;
  f->recorded = false;
  f->last_step = r->hb_step;
  snprintf(f->note, sizeof f->note, "%s", r->rec.note);
  f->watchdog = false;
  size_t k = 0;
  f->stalled[0] = '\0';
  for (int i = 0; i < w->n && k < sizeof f->stalled; i++) {
    const loom_watch_rank *o = &w->ranks[i];
    if (i == best || !o->local || o->dead || o->hb_step < 0 ||
        now - o->hb_t <= limit)
      continue;
    k += (size_t)snprintf(f->stalled + k, sizeof f->stalled - k,
                          "%s%d (step %lld)", k ? ", " : "", o->rank,
                          (long long)o->hb_step);
  }
  f->t_fail = r->hb_t + limit;
  f->t_detect = now;
  w->detected = true;
  r->candidate = true;
  return true;
}

/* Finds rank files not seen before and starts watching their processes;
 * returns whether one of them was already gone. */
typedef struct rank_scan {
  loom_run_watch *w;
  double now;
  bool gone;
} rank_scan;

/* One entry of the status directory: a rank file not seen before is read
 * and its process watched. */
static bool scan_entry(const char *name, void *ctx) {
  rank_scan *sc = ctx;
  loom_run_watch *w = sc->w;
  int rank;
  if (!rank_file(name, &rank) || find(w, rank))
    return true;
  loom_runstat_record rec;
  if (loom_runstat_read(w->dir, rank, &rec) != LOOM_OK)
    return true; /* being written: next scan */
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    loom_watch_rank *nr = realloc(w->ranks, (size_t)cap * sizeof *nr);
    if (!nr)
      return false;
    w->ranks = nr;
    w->cap = cap;
  }
  loom_watch_rank *r = &w->ranks[w->n++];
  memset(r, 0, sizeof *r);
  r->rank = rank;
  r->rec = rec;
  r->pidfd = -1;
  r->wstatus = -1;
  r->t_alive = w->t_polled;
  r->hb_step = -1;
  /* A shared file system may show other hosts' files: their pids are not
   * ours to watch. */
  r->local = same_host(rec.host);
  if (r->local && rec.pid > 0) {
    r->pidfd = (int)syscall(SYS_pidfd_open, rec.pid, 0);
    if (r->pidfd < 0 && errno == ESRCH) {
      mark_dead(r, sc->now);
      sc->gone = true;
    }
  }
  return true;
}

static bool scan(loom_run_watch *w, double now) {
  rank_scan sc = {w, now, false};
  loom_fs_each_entry(AT_FDCWD, w->dir, false, scan_entry, &sc);
  return sc.gone;
}

int loom_watch_local(const loom_run_watch *w) {
  int n = 0;
  for (int i = 0; i < w->n; i++)
    n += w->ranks[i].local;
  return n;
}

int loom_watch_fds(loom_run_watch *w, struct pollfd *fds, int max) {
  int k = 0;
  /* A rank whose pidfd is not readable after this poll was alive now. */
  w->t_polled = loom_time_wall();
  for (int i = 0; i < w->n; i++)
    if (!w->ranks[i].dead && !w->ranks[i].end_seq)
      w->ranks[i].t_alive = w->t_polled;
  /* Every write to a status file (a step, a phase, an exit code) wakes us:
   * a rank that says it failed is acted on before it is even gone, which
   * matters when it hangs on its way out. */
  if (w->ino < 0 && w->dir && w->dir[0]) {
    w->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ino >= 0 &&
        inotify_add_watch(w->ino, w->dir,
                          IN_MODIFY | IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
      close(w->ino);
      w->ino = -2; /* do without: the periodic scan still reads the files */
    }
  }
  if (w->ino >= 0 && k < max) {
    fds[k].fd = w->ino;
    fds[k].events = POLLIN;
    fds[k].revents = 0;
    k++;
  }
  for (int i = 0; i < w->n && k < max; i++)
    if (w->ranks[i].pidfd >= 0) {
      fds[k].fd = w->ranks[i].pidfd;
      fds[k].events = POLLIN;
      fds[k].revents = 0;
      k++;
    }
  return k;
}

/* How a dead (or dying) rank ended, from its record or its zombie status:
 * 1 abnormal, 0 normal, -1 not known yet. */
static int judge(const loom_watch_rank *r, int *code, int *sig, double *t,
                 bool *recorded) {
  const loom_runstat_record *rec = &r->rec;
  *code = -1;
  *sig = 0;
  *recorded = true;
  if (rec->signal > 0) {
    *sig = rec->signal;
    *t = rec->t_exit;
    return 1;
  }
  if (rec->exit_code >= 0) {
    *code = rec->exit_code;
    *t = rec->t_exit;
    /* Stopped by a signal at an agreed step (loom train's note): an end
     * someone asked for, not a failure. */
    if (rec->exit_code > 128 && strncmp(rec->note, "stopped ", 8) == 0)
      return 0;
    return rec->exit_code != 0;
  }
  if (!r->dead)
    return 0;
  /* It stopped at an agreed step and said so; killed on its way out (the
   * launcher takes the rest down when one rank exits non-zero). */
  if (strncmp(rec->note, "stopped ", 8) == 0)
    return 0;
  *recorded = false;
  *t = r->t_seen;
  if (r->wstatus >= 0) {
    if (WIFSIGNALED(r->wstatus)) {
      *sig = WTERMSIG(r->wstatus);
      return 1;
    }
    *code = WEXITSTATUS(r->wstatus);
    return *code != 0;
  }
  /* Gone without a word: killed outright (SIGKILL, the OOM killer, an
   * MPI_Abort elsewhere). A process that went through exit() but did not
   * say its code (-2) is left to the launcher's verdict. */
  return rec->exit_code == -1 ? 1 : -1;
}

/* One abnormal end, as pick_failure weighs it. */
typedef struct end_info {
  int i; /* index in w->ranks */
  int code, sig;
  double t; /* recorded: its record's time; else when its death was seen */
  bool recorded;
} end_info;

/* Whether end a came before end b. A recorded end has an exact time; an
 * unrecorded one (a SIGKILL) lies between the last poll that found the rank
 * alive and the moment its end was read. Between two deaths the kernel's
 * order (end_seq) decides; where times overlap and nothing else tells, the
 * rank that said why it failed goes first, then the evidence of the
 * launcher: its verdict names the signal of the first rank it reaped, the
 * rank it reaped (gone from /proc) died before one still a zombie, and
 * SIGTERM is what a launcher stops the others with. */
static bool end_before(const loom_run_watch *w, const end_info *a,
                       const end_info *b, int launcher_code) {
  const loom_watch_rank *ra = &w->ranks[a->i], *rb = &w->ranks[b->i];
  double a_lo = a->recorded ? a->t : ra->t_alive;
  double a_hi = a->recorded ? a->t : (ra->end_seq ? ra->t_end_read : a->t);
  double b_lo = b->recorded ? b->t : rb->t_alive;
  double b_hi = b->recorded ? b->t : (rb->end_seq ? rb->t_end_read : b->t);
  if (a->recorded && b->recorded)
    return a->t < b->t || (a->t == b->t && ra->rank < rb->rank);
  if (a_hi < b_lo)
    return true;
  if (b_hi < a_lo)
    return false;
  if (a->recorded != b->recorded)
    return a->recorded;
  if (ra->end_seq && rb->end_seq)
    return ra->end_seq < rb->end_seq;
  int lsig =
      launcher_code > 128 && launcher_code < 160 ? launcher_code - 128 : 0;
  if (lsig) {
    bool am = a->sig == lsig || (a->sig == 0 && ra->wstatus < 0);
    bool bm = b->sig == lsig || (b->sig == 0 && rb->wstatus < 0);
    if (am != bm)
      return am;
  }
  if ((ra->wstatus < 0) != (rb->wstatus < 0))
    return ra->wstatus < 0; /* reaped first, so ended first */
  if ((a->sig == SIGTERM) != (b->sig == SIGTERM))
    return b->sig == SIGTERM;
  return ra->rank < rb->rank;
}

/* Whether an end is a casualty of a failure elsewhere: a local rank gone
 * without a record of its own, killed (SIGKILL, SIGTERM or no status
 * known), while ranks run on other hosts. The launcher kills its local
 * ranks that way when a rank on another host fails, and loom run does not
 * see that one die: the launcher's exit code tells it instead. (When every
 * rank runs here, the one killed without a record is the failure.) */
static bool casualty(const loom_run_watch *w, const loom_watch_rank *r,
                     const end_info *e) {
  return !w->all_local && r->local && !e->recorded &&
         (e->sig == SIGKILL || e->sig == SIGTERM ||
          (e->sig == 0 && e->code < 0));
}

/* The failure is the earliest abnormal end among the ranks that loom run
 * did not stop itself (after detection: among the ends seen at that
 * moment): a local rank's, or the record of a rank on another host that
 * loom run can read (a shared file system) saying it failed. A rank whose
 * watchdog fired records exit code 75 before the job is aborted, so it
 * comes before the ranks the abort kills. */
static bool pick_failure(loom_run_watch *w, double now, int launcher_code) {
  end_info best = {.i = -1};
  for (int i = 0; i < w->n; i++) {
    loom_watch_rank *r = &w->ranks[i];
    if (w->detected && !r->candidate)
      continue;
    end_info e = {.i = i};
    /* (another host's rank is never seen dead: only its record counts) */
    if (judge(r, &e.code, &e.sig, &e.t, &e.recorded) != 1 || casualty(w, r, &e))
      continue;
    /* Ended by loom run's own hand (and not before it said it failed). */
    if (r->stopped && !r->candidate && !e.recorded)
      continue;
    if (!w->detected)
      r->candidate = true;
    if (best.i < 0 || end_before(w, &e, &best, launcher_code))
      best = e;
  }
  if (best.i < 0)
    return false;
  loom_watch_rank *r = &w->ranks[best.i];
  loom_run_failure *f = &w->fail;
  f->found = true;
  f->rank = r->rank;
  f->pid = r->rec.pid;
  snprintf(f->host, sizeof f->host, "%s", r->rec.host);
  f->code = best.code;
  f->signal = best.sig;
  f->recorded = best.recorded; /* the rank said it itself */
  f->last_step = r->rec.step;
  snprintf(f->note, sizeof f->note, "%s", r->rec.note);
  f->watchdog = strncmp(r->rec.note, "watchdog", 8) == 0;
  if (!w->detected) {
    f->t_fail = best.t;
    f->t_detect = now;
    if (f->t_fail > now)
      f->t_fail = now;
  }
  w->detected = true;
  return true;
}

void loom_watch_settle(loom_run_watch *w, int launcher_code) {
  if (!w->detected || w->fail.hang)
    return;
  double t_fail = w->fail.t_fail, t_detect = w->fail.t_detect;
  int stopped = w->fail.stopped;
  double t_stopped = w->fail.t_stopped;
  pick_failure(w, t_detect, launcher_code);
  w->fail.t_fail = t_fail;
  w->fail.t_detect = t_detect;
  w->fail.stopped = stopped;
  w->fail.t_stopped = t_stopped;
}

void loom_watch_mark_stopped(loom_run_watch *w) {
  for (int i = 0; i < w->n; i++)
    if (w->ranks[i].local && !w->ranks[i].dead)
      w->ranks[i].stopped = true;
}

int loom_watch_update(loom_run_watch *w, const struct pollfd *fds, int nfds,
                      double now, bool final) {
  /* Deaths first: a pidfd turns readable when its process exits. After the
   * launcher is gone and its session swept (final), every rank is. */
  bool died = false;
  for (int i = 0; i < w->n; i++) {
    loom_watch_rank *r = &w->ranks[i];
    if (r->pidfd < 0)
      continue;
    bool gone = final;
    for (int k = 0; k < nfds && !gone; k++)
      gone = fds[k].fd == r->pidfd && fds[k].revents != 0;
    if (gone) {
      mark_dead(r, now);
      refresh(w, r); /* its last words */
      died = true;
    }
  }
  /* Files written since: refresh those ranks (a new file: scan now); the
   * queue is read whatever poll said, so that an end queued after poll
   * looked at it is not read after a later death. */
  bool spoke = false, fresh = false;
  (void)fds;
  (void)nfds;
  if (w->ino >= 0) {
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t len;
    while ((len = read(w->ino, buf, sizeof buf)) > 0) {
      for (char *p = buf; p < buf + len;) {
        const struct inotify_event *ev = (const struct inotify_event *)p;
        int rank;
        if (ev->len && rank_file(ev->name, &rank)) {
          loom_watch_rank *r = find(w, rank);
          if (!r && (ev->mask & IN_CLOSE_WRITE)) {
            /* It ended before we knew it: learn of it now, in order. */
            if (scan(w, now))
              died = true;
            r = find(w, rank);
          }
          if (!r)
            fresh = true;
          else if (ev->mask & IN_CLOSE_WRITE) {
            if (!r->end_seq) {
              r->end_seq = ++w->end_seq;
              r->t_end_read = now;
            }
            refresh(w, r);
            spoke = true;
          } else if (!r->dead) {
            refresh(w, r);
            spoke = true;
          }
        }
        p += sizeof *ev + ev->len;
      }
    }
  }
  /* On a death, look for files not seen yet at once: the rank that failed
   * first may be one of them. */
  if (now >= w->next_scan || final || died || fresh) {
    if (scan(w, now))
      died = true;
    w->next_scan = now + 0.05;
    if (!died) /* phases and steps, for the recovery figures */
      for (int i = 0; i < w->n; i++)
        if (!w->ranks[i].dead && w->ranks[i].local)
          refresh(w, &w->ranks[i]);
    /* Other hosts' records (a shared file system may not tell inotify):
     * their last words, read once the attempt is over. */
    for (int i = 0; final && i < w->n; i++)
      if (!w->ranks[i].local)
        refresh(w, &w->ranks[i]);
  }
  /* A live rank that recorded a non-zero exit code or a fatal signal is
   * failing now (one on another host too, when its record can be read). */
  bool said_failed = false;
  for (int i = 0; spoke && i < w->n; i++) {
    const loom_runstat_record *rec = &w->ranks[i].rec;
    said_failed |=
        !w->ranks[i].dead &&
        ((rec->exit_code > 0 && strncmp(rec->note, "stopped ", 8) != 0) ||
         rec->signal > 0);
  }
  if ((died || final || said_failed) && !w->fail.found) {
    /* Who else has spoken: a watchdog rank may not be dead yet. */
    for (int i = 0; i < w->n; i++)
      if (!w->ranks[i].dead && w->ranks[i].local)
        refresh(w, &w->ranks[i]);
    if (pick_failure(w, now, -1))
      return 1;
  }
  if (!final && !w->fail.found && find_hang(w, now))
    return 1;
  return 0;
}

bool loom_watch_scanning(const loom_run_watch *w) {
  return w->expect_local <= 0 || loom_watch_local(w) < w->expect_local ||
         (w->want_progress && !w->first_step_told);
}

int loom_watch_stop_others(loom_run_watch *w) {
  int n = 0;
  for (int i = 0; i < w->n; i++) {
    loom_watch_rank *r = &w->ranks[i];
    if (r->dead || !r->local || r->pidfd < 0)
      continue;
    /* SIGKILL: they are stuck in or heading into collectives with a dead
     * peer, and checkpoints are written atomically, so nothing is lost
     * that a graceful stop would have kept. The failing rank itself, when
     * it said so before leaving, goes too: it has had its say, and may be
     * hanging on its way out. */
    r->stopped = true;
    if (syscall(SYS_pidfd_send_signal, r->pidfd, SIGKILL, NULL, 0) == 0)
      n++;
  }
  return n;
}

int loom_watch_alive(const loom_run_watch *w) {
  int n = 0;
  for (int i = 0; i < w->n; i++)
    n += w->ranks[i].local && !w->ranks[i].dead && w->ranks[i].pidfd >= 0;
  return n;
}

bool loom_watch_progress(loom_run_watch *w) {
  if (w->first_step_told || w->n == 0)
    return false;
  if (w->expect_local > 0 && loom_watch_local(w) < w->expect_local)
    return false;
  loom_run_progress p = w->prog;
  p.t_exec = p.t_comm_ready = p.t_loaded = p.t_training = p.t_first_step = 0;
  p.first_step = -1;
  p.ranks = 0;
  for (int i = 0; i < w->n; i++) {
    const loom_watch_rank *r = &w->ranks[i];
    if (!r->local)
      continue;
    if (r->rec.t_first_step <= 0)
      return false; /* the group's first step is its last rank's */
    const double *tp = r->rec.t_phase;
    if (tp[LOOM_RUNSTAT_START] > p.t_exec)
      p.t_exec = tp[LOOM_RUNSTAT_START];
    if (tp[LOOM_RUNSTAT_TRAINING] > p.t_training)
      p.t_training = tp[LOOM_RUNSTAT_TRAINING];
    if (tp[LOOM_RUNSTAT_COMM_READY] > p.t_comm_ready)
      p.t_comm_ready = tp[LOOM_RUNSTAT_COMM_READY];
    if (tp[LOOM_RUNSTAT_LOADED] > p.t_loaded)
      p.t_loaded = tp[LOOM_RUNSTAT_LOADED];
    if (r->rec.t_first_step > p.t_first_step) {
      p.t_first_step = r->rec.t_first_step;
      p.first_step = r->rec.first_step;
    }
    p.ranks++;
  }
  w->prog = p;
  w->first_step_told = true;
  return true;
}

int loom_watch_signal_all(loom_run_watch *w, int sig) {
  int n = 0;
  for (int i = 0; i < w->n; i++) {
    loom_watch_rank *r = &w->ranks[i];
    if (!r->dead && r->local && r->pidfd >= 0 &&
        syscall(SYS_pidfd_send_signal, r->pidfd, sig, NULL, 0) == 0)
      n++;
  }
  return n;
}

bool loom_watch_all_known(const loom_run_watch *w) {
  return w->all_local && w->expect_local > 0 &&
         loom_watch_local(w) >= w->expect_local;
}

void loom_watch_stop_summary(const loom_run_watch *w, loom_run_stop *st) {
  memset(st, 0, sizeof *st);
  st->step = -1;
  for (int i = 0; i < w->n; i++) {
    const loom_watch_rank *r = &w->ranks[i];
    if (!r->local)
      continue;
    st->ranks++;
    const char *at = strstr(r->rec.note, " at step ");
    int64_t step;
    if (strncmp(r->rec.note, "stopped ", 8) != 0 || !at ||
        !loom_parse_i64_at(at + strlen(" at step "), NULL, &step))
      continue;
    st->stopped++;
    if (strstr(at, "checkpoint saved"))
      st->saved++;
    if (strncmp(r->rec.note, "stopped by SIG", 14) == 0 && !st->by[0])
      sscanf(r->rec.note + 11, "%15[A-Z]", st->by);
    if (st->step < 0)
      st->step = step;
    else if (st->step != step)
      st->steps_differ = true;
  }
}
