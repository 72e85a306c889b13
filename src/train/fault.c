/* Fault injection for recovery tests and demos (LOOM_FAULT): parsing, and
 * the faults themselves, fired by the training loop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom/ckpt.h"
#include "loom/run.h"
#include "trainer.h"

static const char *const fault_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_FAULT_KIND_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof fault_names / sizeof fault_names[0] ==
                   LOOM_FAULT_KIND_COUNT,
               "fault kind names");

const char *loom_fault_kind_name(loom_fault_kind k) {
  return (unsigned)k < LOOM_FAULT_KIND_COUNT ? fault_names[k] : "?";
}

#define FAULT_SYNTAX                                                           \
  "expected RANK:STEP:KIND[:ARG][,...], KIND one of exit, segv, hang, "        \
  "corrupt, slow, slow_data, grad_inf"

static bool parse_ll(const char *s, size_t n, long long lo, long long hi,
                     long long *out) {
  char buf[32];
  if (n == 0 || n >= sizeof buf)
    return false;
  memcpy(buf, s, n);
  buf[n] = '\0';
  char *end;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi || buf[0] == '+' ||
      buf[0] == ' ')
    return false;
  *out = v;
  return true;
}

static bool parse_secs(const char *s, size_t n, double *out) {
  char buf[32];
  if (n == 0 || n >= sizeof buf)
    return false;
  memcpy(buf, s, n);
  buf[n] = '\0';
  char *end;
  errno = 0;
  double v = strtod(buf, &end);
  if (*end != '\0' || errno != 0 || !(v > 0) || v > 3600 || buf[0] == ' ')
    return false;
  *out = v;
  return true;
}

/* One item "RANK:STEP:KIND[:ARG]" of n bytes. */
static loom_status parse_one(const char *item, size_t n, loom_fault *f) {
  const char *field[5];
  size_t len[5];
  int k = 0;
  const char *p = item, *end = item + n;
  while (k < 5) {
    const char *c = memchr(p, ':', (size_t)(end - p));
    field[k] = p;
    len[k] = (size_t)((c ? c : end) - p);
    k++;
    if (!c)
      break;
    p = c + 1;
  }
  if (k < 3 || k > 4)
    return loom_error(LOOM_ERR_CONFIG, "LOOM_FAULT: '%.*s': %s", (int)n, item,
                      FAULT_SYNTAX);
  long long v;
  if (!parse_ll(field[0], len[0], 0, 1 << 20, &v))
    return loom_error(LOOM_ERR_CONFIG,
                      "LOOM_FAULT: '%.*s': rank '%.*s' is not a rank number "
                      "(%s)",
                      (int)n, item, (int)len[0], field[0], FAULT_SYNTAX);
  f->rank = (int)v;
  if (!parse_ll(field[1], len[1], 1, INT64_MAX / 2, &v))
    return loom_error(LOOM_ERR_CONFIG,
                      "LOOM_FAULT: '%.*s': step '%.*s' is not a step number "
                      ">= 1 (%s)",
                      (int)n, item, (int)len[1], field[1], FAULT_SYNTAX);
  f->step = v;
  int kind = -1;
  for (int i = 0; i < LOOM_FAULT_KIND_COUNT; i++)
    if (strlen(fault_names[i]) == len[2] &&
        memcmp(fault_names[i], field[2], len[2]) == 0)
      kind = i;
  if (kind < 0)
    return loom_error(LOOM_ERR_CONFIG,
                      "LOOM_FAULT: '%.*s': unknown kind '%.*s' (%s)", (int)n,
                      item, (int)len[2], field[2], FAULT_SYNTAX);
  f->kind = (loom_fault_kind)kind;
  f->arg = f->kind == LOOM_FAULT_EXIT                                      ? 1
           : f->kind == LOOM_FAULT_SLOW || f->kind == LOOM_FAULT_SLOW_DATA ? 0.2
                                                                           : 0;
  if (k == 4) {
    if (f->kind == LOOM_FAULT_EXIT) {
      if (!parse_ll(field[3], len[3], 1, 255, &v))
        return loom_error(LOOM_ERR_CONFIG,
                          "LOOM_FAULT: '%.*s': exit code '%.*s' is not in "
                          "1..255",
                          (int)n, item, (int)len[3], field[3]);
      f->arg = (double)v;
    } else if (f->kind == LOOM_FAULT_SLOW || f->kind == LOOM_FAULT_SLOW_DATA) {
      if (!parse_secs(field[3], len[3], &f->arg))
        return loom_error(LOOM_ERR_CONFIG,
                          "LOOM_FAULT: '%.*s': '%.*s' is not a number of "
                          "seconds in (0, 3600]",
                          (int)n, item, (int)len[3], field[3]);
    } else {
      return loom_error(LOOM_ERR_CONFIG,
                        "LOOM_FAULT: '%.*s': kind '%s' takes no argument",
                        (int)n, item, fault_names[kind]);
    }
  }
  return LOOM_OK;
}

loom_status loom_fault_parse(const char *spec, loom_fault *faults, int max,
                             int *n) {
  if (!faults || !n || max < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_fault_parse: NULL argument");
  *n = 0;
  if (!spec || !*spec)
    return LOOM_OK;
  const char *p = spec;
  for (;;) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    if (*n == max)
      return loom_error(LOOM_ERR_CONFIG, "LOOM_FAULT: more than %d faults",
                        max);
    loom_fault f;
    LOOM_TRY(parse_one(p, len, &f));
    faults[(*n)++] = f;
    if (!c)
      return LOOM_OK;
    p = c + 1;
  }
}

loom_status loom_train_fault_init(loom_trainer *t) {
  t->n_faults = 0;
  const char *spec = getenv("LOOM_FAULT");
  if (!spec || !*spec)
    return LOOM_OK;
  loom_fault all[LOOM_FAULT_MAX];
  int n = 0;
  LOOM_TRY(loom_fault_parse(spec, all, LOOM_FAULT_MAX, &n));
  for (int i = 0; i < n; i++)
    if (all[i].rank >= t->nranks)
      return loom_error(LOOM_ERR_CONFIG,
                        "LOOM_FAULT: rank %d does not exist in a job of %d "
                        "rank%s",
                        all[i].rank, t->nranks, t->nranks == 1 ? "" : "s");
  /* A restarted job must get through, or recovery could never be shown. */
  const char *rc = getenv("LOOM_RESTART_COUNT");
  if (rc && *rc && strcmp(rc, "0") != 0) {
    if (t->rank == 0)
      LOOM_INFO("LOOM_FAULT not armed: this is restart %s", rc);
    return LOOM_OK;
  }
  if (t->rank == 0)
    LOOM_WARN("LOOM_FAULT=%s: fault injection armed", spec);
  for (int i = 0; i < n; i++)
    if (all[i].rank == t->rank)
      t->faults[t->n_faults++] = all[i];
  return LOOM_OK;
}

/* Says what is about to happen: in the log, and to the launcher. */
static void announce(const char *what) {
  loom_runstat_note(what);
  LOOM_WARN("%s", what);
  fflush(NULL);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The one place in src/ that ends the process on purpose: an injected
 * fault imitates a crash, so nothing may unwind or finalize MPI. */
static _Noreturn void fault_exit(int code) {
  loom_runstat_exit(code);
  _exit(code);
}

double loom_train_fault_data_delay(loom_trainer *t) {
  for (int i = 0; i < t->n_faults; i++) {
    const loom_fault *f = &t->faults[i];
    /* t->step: the steps done; this batch is for step t->step + 1. */
    if (f->kind != LOOM_FAULT_SLOW_DATA || t->step + 1 < f->step)
      continue;
    if (!t->slow_data_noted) {
      char what[128];
      snprintf(what, sizeof what,
               "fault injected: slow data (every batch %g s late) from step "
               "%lld",
               f->arg, (long long)t->step + 1);
      announce(what);
      t->slow_data_noted = true;
    }
    double t0 = loom_time_now();
    sleep_s(f->arg);
    return loom_time_now() - t0;
  }
  return 0;
}

void loom_train_fault_after_step(loom_trainer *t) {
  char what[128];
  for (int i = 0; i < t->n_faults; i++) {
    const loom_fault *f = &t->faults[i];
    if (f->kind == LOOM_FAULT_SLOW && t->step >= f->step) {
      if (!t->slow_noted) {
        snprintf(what, sizeof what,
                 "fault injected: slow (%g s per step) from step %lld", f->arg,
                 (long long)t->step);
        announce(what);
        t->slow_noted = true;
      }
      sleep_s(f->arg);
      continue;
    }
    if (t->step != f->step)
      continue;
    switch (f->kind) {
    case LOOM_FAULT_EXIT:
      snprintf(what, sizeof what, "fault injected: exit %d at step %lld",
               (int)f->arg, (long long)t->step);
      announce(what);
      fault_exit((int)f->arg);
    case LOOM_FAULT_SEGV: {
      snprintf(what, sizeof what, "fault injected: segv at step %lld",
               (long long)t->step);
      announce(what);
      /* The signal a bad pointer brings, through whatever handlers are
       * installed (the run status records it); not a write through NULL,
       * which the sanitizers would report as their own error. */
      raise(SIGSEGV);
      signal(SIGSEGV, SIG_DFL);
      raise(SIGSEGV);
      fault_exit(128 + SIGSEGV);
    }
    case LOOM_FAULT_HANG: {
      snprintf(what, sizeof what, "fault injected: hang at step %lld",
               (long long)t->step);
      announce(what);
      /* The trainer's handlers only ask for a stop at the next step, which
       * never comes: let SIGINT and SIGTERM end the process again. */
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      for (;;)
        sleep(1);
    }
    default:
      break; /* corrupt fires after a save; slow above */
    }
  }
}

void loom_train_fault_after_save(loom_trainer *t, int64_t step) {
  for (int i = 0; i < t->n_faults; i++) {
    const loom_fault *f = &t->faults[i];
    if (f->kind != LOOM_FAULT_CORRUPT || step < f->step)
      continue;
    char dir[LOOM_CONFIG_STR_MAX + 64], what[LOOM_CONFIG_STR_MAX + 160];
    loom_status s =
        loom_ckpt_dir_name(t->cfg.checkpoint.dir, step, dir, sizeof dir);
    snprintf(what, sizeof what,
             "fault injected: corrupt (a flipped byte in %s/shard_%05d.bin) "
             "at step %lld",
             dir, t->rank, (long long)step);
    announce(what);
    if (s == LOOM_OK)
      s = loom_ckpt_damage(dir, LOOM_CKPT_DAMAGE_FLIP, t->rank);
    if (s != LOOM_OK)
      LOOM_WARN("fault injection: %s", loom_last_error());
    fault_exit(1);
  }
}
