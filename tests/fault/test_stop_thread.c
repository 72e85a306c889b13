/* The stop flag across threads: a stop signal taken by the stop-signal
 * thread (loom_trainer_catch_stop_signals), or by the handler on a thread
 * that started before it (libopenblas's pool), and a
 * loom_trainer_request_stop from a thread of the program are seen by the
 * thread that trains, with the first signal. Under ThreadSanitizer (label
 * tsan) the flag's reads and writes must be race-free: before they were
 * atomics, both cases were reported as data races. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "loom/train.h"
#include "tt.h"

/* Each wait ends because the other thread's write is seen, never by a
 * sleep (the CTest timeout catches a write that is never seen). */
static void *request_stop(void *arg) {
  (void)arg;
  loom_trainer_request_stop();
  return NULL;
}

/* A program's own thread asks for the stop while this one polls: the flag
 * is the only thing between them (no join before the poll ends). */
TT_TEST(test_request_from_another_thread) {
  TT_CHECK(!loom_trainer_stop_requested());
  pthread_t th;
  TT_REQUIRE(pthread_create(&th, NULL, request_stop, NULL) == 0);
  while (!loom_trainer_stop_requested())
    sched_yield();
  pthread_join(th, NULL);
  TT_CHECK_EQ(loom_trainer_stop_signal(), 0); /* no signal came */
}

TT_TEST(test_signal_thread_sets_the_signal) {
  /* Blocked in this thread: the stop-signal thread takes it. */
  TT_REQUIRE(kill(getpid(), SIGTERM) == 0);
  while (loom_trainer_stop_signal() == 0)
    sched_yield();
  TT_CHECK_EQ(loom_trainer_stop_signal(), SIGTERM);
  TT_CHECK(loom_trainer_stop_requested());
  /* A second signal, taken now or later, leaves the first one as the one
   * to exit by. */
  TT_REQUIRE(kill(getpid(), SIGINT) == 0);
  TT_CHECK_EQ(loom_trainer_stop_signal(), SIGTERM);
}

int main(void) {
  /* Before any thread starts, as loom train does. */
  loom_trainer_catch_stop_signals();
  TT_RUN(test_request_from_another_thread);
  TT_RUN(test_signal_thread_sets_the_signal);
  return tt_finish();
}
