/* The prefetching loader: a thread fills a ring of batch buffers in
 * sequence order while the caller computes; positions make it resumable. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct slot {
  loom_batch b;
  loom_status st; /* of the fill; an error travels to the caller */
  char err[512];  /* its message (errors are thread-local) */
} slot;

struct loom_loader {
  const loom_dataset *ds;
  loom_loader_opts o;
  loom_sampler *sampler; /* the worker's while it runs */
  int64_t nb, gb;
  int nslots;
  slot *slots;      /* (nslots) ring: the caller's batch + prefetch ahead */
  int64_t *scratch; /* (B) sample ids, worker side */

  pthread_mutex_t mu;
  pthread_cond_t filled; /* a slot became ready */
  pthread_cond_t freed;  /* the caller released one, or stop */
  int64_t produced;      /* slots filled since (re)start */
  int64_t consumed;      /* slots handed to the caller */
  bool holding;          /* the caller still holds slot consumed-1 */
  bool stop;
  bool running;
  pthread_t thread;
  loom_loader_state prod; /* the worker's next position */
  /* An epoch a seek entered mid-batch: its batches start at sample
   * `start` (-1: none). Changed only while the worker is stopped. */
  int64_t start_epoch, start;

  /* caller side */
  loom_loader_state next; /* position of the next batch returned */
  loom_status failed;     /* sticky after an error */
  char failed_msg[512];
  double wait_total;
  int64_t served;
};

loom_loader_opts loom_loader_opts_default(void) {
  loom_loader_opts o;
  o.sampler = loom_sampler_opts_default();
  o.prefetch = 2;
  return o;
}

/* Global batches of `epoch`: nb, but for an epoch entered mid-batch. */
static int64_t epoch_nb(const loom_loader *l, int64_t epoch) {
  return epoch == l->start_epoch
             ? loom_sampler_batches_from(l->sampler, l->start)
             : l->nb;
}

static void advance(const loom_loader *l, loom_loader_state *p) {
  if (++p->batch >= epoch_nb(l, p->epoch)) {
    p->batch = 0;
    p->epoch++;
  }
}

/* Fills one slot with the batch at `pos` (the only code that reads the
 * data set); what it makes depends on `pos` alone. */
static void produce(loom_loader *l, slot *s, loom_loader_state pos) {
  int64_t count = 0;
  loom_status st = loom_sampler_set_epoch(l->sampler, pos.epoch);
  if (st == LOOM_OK && pos.epoch == l->start_epoch)
    st = loom_sampler_batch_from(l->sampler, l->start, pos.batch, l->scratch,
                                 &count);
  else if (st == LOOM_OK)
    st = loom_sampler_batch(l->sampler, pos.batch, l->scratch, &count);
  if (st == LOOM_OK)
    st = loom_dataset_fill(l->ds, pos.epoch, l->scratch, count, &s->b);
  s->st = st;
  s->err[0] = '\0';
  if (st != LOOM_OK) {
    snprintf(s->err, sizeof s->err, "%s", loom_last_error());
    return;
  }
  s->b.epoch = pos.epoch;
  s->b.index = pos.batch;
  s->b.last_in_epoch = pos.batch == epoch_nb(l, pos.epoch) - 1;
  s->b.wait_s = 0.0;
}

static void *worker(void *arg) {
  loom_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    /* Slots in use: those between the oldest the caller has not released
     * and the newest filled. */
    while (!l->stop &&
           l->produced - (l->consumed - (l->holding ? 1 : 0)) >= l->nslots)
      pthread_cond_wait(&l->freed, &l->mu);
    if (l->stop)
      break;
    slot *s = &l->slots[l->produced % l->nslots];
    loom_loader_state pos = l->prod;
    pthread_mutex_unlock(&l->mu);
    produce(l, s, pos);
    pthread_mutex_lock(&l->mu);
    l->produced++;
    advance(l, &l->prod);
    pthread_cond_signal(&l->filled);
    if (s->st != LOOM_OK)
      break; /* the caller receives the error with this slot */
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

static loom_status start_worker(loom_loader *l) {
  l->produced = l->consumed = 0;
  l->holding = false;
  l->stop = false;
  l->prod = l->next;
  if (l->o.prefetch == 0)
    return LOOM_OK;
  int e = pthread_create(&l->thread, NULL, worker, l);
  if (e != 0) {
    /* Sticky, so a later loom_loader_next fails instead of waiting. */
    l->failed = LOOM_ERR_INTERNAL;
    snprintf(l->failed_msg, sizeof l->failed_msg,
             "loader: cannot start the prefetch thread: %s", strerror(e));
    return loom_error(l->failed, "%s", l->failed_msg);
  }
  l->running = true;
  return LOOM_OK;
}

static void stop_worker(loom_loader *l) {
  if (!l->running)
    return;
  pthread_mutex_lock(&l->mu);
  l->stop = true;
  pthread_cond_broadcast(&l->freed);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->thread, NULL);
  l->running = false;
}

loom_status loom_loader_new(loom_loader **out, const loom_dataset *ds,
                            const loom_loader_opts *opts) {
  if (!out || !ds)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_loader_new: NULL argument");
  *out = NULL;
  loom_loader_opts o = opts ? *opts : loom_loader_opts_default();
  if (o.prefetch < 0 || o.prefetch > LOOM_LOADER_MAX_PREFETCH)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loader: prefetch %d out of range [0, %d]", o.prefetch,
                      LOOM_LOADER_MAX_PREFETCH);
  loom_loader *l = loom_calloc(1, sizeof *l);
  if (!l)
    return LOOM_ERR_NOMEM;
  loom_status st = LOOM_OK;
  bool sync_init = false;
  l->ds = ds;
  l->o = o;
  LOOM_TRY_GOTO(st, loom_sampler_new(&l->sampler, ds->len, &o.sampler), fail);
  l->nb = loom_sampler_num_batches(l->sampler);
  l->gb = o.sampler.batch * o.sampler.world;
  l->start_epoch = -1;
  l->nslots = o.prefetch + 1;
  l->slots = loom_calloc((size_t)l->nslots, sizeof *l->slots);
  l->scratch = loom_calloc((size_t)o.sampler.batch, sizeof *l->scratch);
  if (!l->slots || !l->scratch) {
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  for (int i = 0; i < l->nslots; i++)
    LOOM_TRY_GOTO(st, loom_batch_alloc(&l->slots[i].b, ds, o.sampler.batch),
                  fail);
  if (pthread_mutex_init(&l->mu, NULL) != 0) {
    st = loom_error(LOOM_ERR_INTERNAL, "loader: pthread_mutex_init failed");
    goto fail;
  }
  if (pthread_cond_init(&l->filled, NULL) != 0) {
    pthread_mutex_destroy(&l->mu);
    st = loom_error(LOOM_ERR_INTERNAL, "loader: pthread_cond_init failed");
    goto fail;
  }
  if (pthread_cond_init(&l->freed, NULL) != 0) {
    pthread_cond_destroy(&l->filled);
    pthread_mutex_destroy(&l->mu);
    st = loom_error(LOOM_ERR_INTERNAL, "loader: pthread_cond_init failed");
    goto fail;
  }
  sync_init = true;
  LOOM_TRY_GOTO(st, start_worker(l), fail);
  *out = l;
  return LOOM_OK;

fail:
  if (sync_init) {
    pthread_cond_destroy(&l->freed);
    pthread_cond_destroy(&l->filled);
    pthread_mutex_destroy(&l->mu);
  }
  for (int i = 0; l->slots && i < l->nslots; i++)
    loom_batch_free(&l->slots[i].b);
  loom_free(l->slots);
  loom_free(l->scratch);
  loom_sampler_free(l->sampler);
  loom_free(l);
  return st;
}

void loom_loader_free(loom_loader *l) {
  if (!l)
    return;
  stop_worker(l);
  pthread_cond_destroy(&l->freed);
  pthread_cond_destroy(&l->filled);
  pthread_mutex_destroy(&l->mu);
  for (int i = 0; i < l->nslots; i++)
    loom_batch_free(&l->slots[i].b);
  loom_free(l->slots);
  loom_free(l->scratch);
  loom_sampler_free(l->sampler);
  loom_free(l);
}

loom_status loom_loader_next(loom_loader *l, const loom_batch **batch) {
  if (!l || !batch)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_loader_next: NULL argument");
  *batch = NULL;
  if (l->failed != LOOM_OK)
    return loom_error(l->failed, "%s", l->failed_msg);
  slot *s;
  double t0 = loom_time_now();
  if (l->o.prefetch == 0) {
    s = &l->slots[0];
    produce(l, s, l->next);
  } else {
    pthread_mutex_lock(&l->mu);
    if (l->holding) {
      l->holding = false;
      pthread_cond_signal(&l->freed);
    }
    while (l->produced == l->consumed)
      pthread_cond_wait(&l->filled, &l->mu);
    s = &l->slots[l->consumed % l->nslots];
    l->consumed++;
    l->holding = true;
    pthread_mutex_unlock(&l->mu);
  }
  double waited = loom_time_now() - t0;
  if (s->st != LOOM_OK) {
    l->failed = s->st;
    snprintf(l->failed_msg, sizeof l->failed_msg, "%s", s->err);
    return loom_error(l->failed, "%s", l->failed_msg);
  }
  s->b.wait_s = waited;
  l->wait_total += waited;
  l->served++;
  advance(l, &l->next);
  *batch = &s->b;
  return LOOM_OK;
}

void loom_loader_get_state(const loom_loader *l, loom_loader_state *st) {
  if (!st)
    return;
  if (!l) {
    *st = (loom_loader_state){0, 0, 0};
    return;
  }
  st->epoch = l->next.epoch;
  st->batch = l->next.batch;
  st->global_batch = l->gb;
}

/* Epochs a position may name: the next epoch (epoch + 1, where the end of
 * one continues) always fits. */
#define LOADER_MAX_EPOCH ((int64_t)1 << 62)

static loom_status check_epoch(const char *call, int64_t epoch) {
  if (epoch < 0 || epoch >= LOADER_MAX_EPOCH)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "%s: epoch %lld out of range [0, 2^62)", call,
                      (long long)epoch);
  return LOOM_OK;
}

loom_status loom_loader_set_state(loom_loader *l, const loom_loader_state *st) {
  if (!l || !st)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loom_loader_set_state: NULL argument");
  LOOM_TRY(check_epoch("loader state", st->epoch));
  if (st->batch < 0)
    return loom_error(LOOM_ERR_INVALID_ARG, "loader state: batch %lld < 0",
                      (long long)st->batch);
  if (st->global_batch < 0)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loader state: global_batch %lld < 0",
                      (long long)st->global_batch);
  loom_loader_state pos = {st->epoch, st->batch, l->gb};
  if (st->global_batch != 0 && st->global_batch != l->gb) {
    /* Saved with another global batch: continue after the same number of
     * samples of the epoch. That run's epoch had at most ceil(N / its GB)
     * batches (any tail rule), so batch * GB stays below N + GB. */
    const int64_t n = l->ds->len, g = st->global_batch;
    const int64_t nb_then = n / g + (n % g != 0);
    if (st->batch > nb_then)
      return loom_error(LOOM_ERR_INVALID_ARG,
                        "loader state: batch %lld beyond the %lld batches "
                        "of global_batch %lld in an epoch of %lld samples",
                        (long long)st->batch, (long long)nb_then, (long long)g,
                        (long long)n);
    int64_t samples = st->batch * g;
    if (samples % l->gb != 0)
      return loom_error(LOOM_ERR_MISMATCH,
                        "loader state: %lld samples into epoch %lld (batch "
                        "%lld x %lld) is not a whole number of global batches "
                        "of %lld",
                        (long long)samples, (long long)st->epoch,
                        (long long)st->batch, (long long)st->global_batch,
                        (long long)l->gb);
    pos.batch = samples / l->gb;
    if (pos.batch >= l->nb) {
      pos.epoch++;
      pos.batch = 0;
    }
  } else if (pos.batch > l->nb) {
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loader state: batch %lld beyond the %lld batches of an "
                      "epoch",
                      (long long)pos.batch, (long long)l->nb);
  } else if (pos.batch == l->nb) {
    pos.epoch++;
    pos.batch = 0;
  }
  stop_worker(l);
  l->next = pos;
  l->start_epoch = -1;
  l->failed = LOOM_OK;
  l->failed_msg[0] = '\0';
  return start_worker(l);
}

loom_status loom_loader_seek(loom_loader *l, int64_t epoch, int64_t sample) {
  if (!l)
    return loom_error(LOOM_ERR_INVALID_ARG, "loom_loader_seek: NULL loader");
  int64_t n = l->ds->len;
  LOOM_TRY(check_epoch("loom_loader_seek", epoch));
  if (sample < 0 || sample > n)
    return loom_error(LOOM_ERR_INVALID_ARG,
                      "loader: sample %lld of epoch %lld is outside the %lld "
                      "samples of an epoch",
                      (long long)sample, (long long)epoch, (long long)n);
  loom_loader_state pos = {epoch, 0, l->gb};
  int64_t start_epoch = -1;
  if (sample % l->gb == 0) {
    pos.batch = sample / l->gb;
  } else if (loom_sampler_batches_from(l->sampler, sample) > 0) {
    /* Saved with another global batch: the rest of this epoch is cut into
     * ours from that sample on, so none is skipped or repeated. */
    start_epoch = epoch;
  } else {
    pos.batch = l->nb; /* too little left for a batch: the epoch is over */
  }
  if (pos.batch >= l->nb) {
    pos.epoch++;
    pos.batch = 0;
  }
  stop_worker(l);
  l->next = pos;
  l->start_epoch = start_epoch;
  l->start = start_epoch >= 0 ? sample : 0;
  l->failed = LOOM_OK;
  l->failed_msg[0] = '\0';
  return start_worker(l);
}

int64_t loom_loader_batch_first(const loom_loader *l, int64_t epoch,
                                int64_t batch) {
  if (!l)
    return 0;
  return (epoch == l->start_epoch ? l->start : 0) + batch * l->gb;
}

int64_t loom_loader_sample(const loom_loader *l) {
  if (!l)
    return 0;
  return loom_loader_batch_first(l, l->next.epoch, l->next.batch);
}

int64_t loom_loader_epoch_batches(const loom_loader *l, int64_t epoch) {
  if (!l)
    return 0;
  return epoch_nb(l, epoch);
}

int64_t loom_loader_batches_per_epoch(const loom_loader *l) {
  return l ? l->nb : 0;
}

double loom_loader_wait_total(const loom_loader *l) {
  return l ? l->wait_total : 0.0;
}

int64_t loom_loader_served(const loom_loader *l) { return l ? l->served : 0; }
