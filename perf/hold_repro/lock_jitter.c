// LD_PRELOAD for tritonserver: after a pthread mutex is taken, now and then sleep while holding it.
//
// Why: the races of tritonserver 2.51's gRPC stream handler (perf/hold_repro/wedge.py) live in
// windows of a few instructions between two lock acquisitions. A preempted thread (a slow or
// stolen-from host) widens them; this widens them on purpose, so that the dev box shows in seconds
// what the H200 machines showed once in many soaks. It changes timing only, never what a lock
// protects.
//
//   LOCK_JITTER=EVERY:US      one acquisition in EVERY (per thread, pseudo-random) then sleeps US µs
//   LOCK_JITTER_ONLY=NAME     only in the process whose program name is NAME (e.g. tritonserver),
//                             so the stubs and clients that inherit LD_PRELOAD keep their timing
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// glibc's own entry under another name: no dlsym, which itself takes locks before our constructor ran.
extern int __pthread_mutex_lock(pthread_mutex_t *);
extern char *program_invocation_short_name;

static unsigned every = 0, sleep_us = 0;
static __thread unsigned long long rng;

__attribute__((constructor)) static void init(void) {
  const char *spec = getenv("LOCK_JITTER");
  const char *only = getenv("LOCK_JITTER_ONLY");
  if (!spec || (only && strcmp(only, program_invocation_short_name) != 0)) return;
  every = (unsigned)strtoul(spec, NULL, 10);
  const char *colon = strchr(spec, ':');
  sleep_us = colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 100;
}

int pthread_mutex_lock(pthread_mutex_t *m) {
  int rc = __pthread_mutex_lock(m);
  if (rc == 0 && every) {
    if (!rng) rng = (unsigned long long)(size_t)&rng ^ 0x9E3779B97F4A7C15ull;  // per thread
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    if (rng % every == 0) {
      int saved = errno;  // the caller may look at errno after a lock; nanosleep must not change it
      struct timespec ts = {0, (long)sleep_us * 1000};
      nanosleep(&ts, NULL);
      errno = saved;
    }
  }
  return rc;
}
