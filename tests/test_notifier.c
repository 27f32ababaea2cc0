/* notifier: items fire on its thread, in order, only after a kick; a full queue refuses; stop
 * fires what is still queued. The waits below are on events (a condition variable), with a
 * generous ceiling only as a guard against a hang. */
#include "engine/notifier.h"

#include <pthread.h>
#include <time.h>

#include "test.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int fired[256], n_fired;
static pthread_t fired_on[256];

static void fire(void *item) {
  pthread_mutex_lock(&mu);
  fired_on[n_fired] = pthread_self();
  fired[n_fired++] = (int)(long)item;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

static void reset(void) {
  pthread_mutex_lock(&mu);
  n_fired = 0;
  pthread_mutex_unlock(&mu);
}

/* waits until n items have fired (ceiling 30 s: a hang fails, timing never does) */
static int wait_fired(int n) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 30;
  pthread_mutex_lock(&mu);
  while (n_fired < n)
    if (pthread_cond_timedwait(&cv, &mu, &until) != 0) break;
  int got = n_fired;
  pthread_mutex_unlock(&mu);
  return got;
}

TEST(fires_in_order_after_a_kick) {
  reset();
  notifier *n = notifier_start(fire, 8);
  REQUIRE(n != NULL);
  for (long i = 1; i <= 5; i++) EXPECT(notifier_post(n, (void *)i) == 0);
  notifier_kick(n);
  EXPECT(wait_fired(5) == 5);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < 5; i++) {
    EXPECT_MSG(fired[i] == i + 1, "item %d fired as %d", i + 1, fired[i]);
    EXPECT_MSG(!pthread_equal(fired_on[i], pthread_self()), "item %d fired on the caller", i + 1);
  }
  pthread_mutex_unlock(&mu);
  /* a second round reuses the swapped queues */
  for (long i = 6; i <= 13; i++) EXPECT(notifier_post(n, (void *)i) == 0);
  notifier_kick(n);
  EXPECT(wait_fired(13) == 13);
  pthread_mutex_lock(&mu);
  for (int i = 5; i < 13; i++)
    EXPECT_MSG(fired[i] == i + 1, "item %d fired as %d", i + 1, fired[i]);
  pthread_mutex_unlock(&mu);
  notifier_stop(n);
  EXPECT(n_fired == 13);
}

TEST(full_queue_refuses) {
  reset();
  notifier *n = notifier_start(fire, 4);
  REQUIRE(n != NULL);
  for (long i = 1; i <= 4; i++) EXPECT(notifier_post(n, (void *)i) == 0);
  EXPECT(notifier_post(n, (void *)5L) == -1); /* the caller fires it itself */
  notifier_kick(n);
  EXPECT(wait_fired(4) == 4);
  notifier_stop(n);
  EXPECT(n_fired == 4);
}

TEST(stop_fires_what_is_queued) {
  reset();
  notifier *n = notifier_start(fire, 16);
  REQUIRE(n != NULL);
  for (long i = 1; i <= 10; i++) EXPECT(notifier_post(n, (void *)i) == 0);
  notifier_stop(n); /* no kick: stop still runs them, in order */
  EXPECT_MSG(n_fired == 10, "%d of 10 fired", n_fired);
  for (int i = 0; i < n_fired; i++) EXPECT(fired[i] == i + 1);
  notifier_stop(NULL);
}

int main(void) {
  RUN(fires_in_order_after_a_kick);
  RUN(full_queue_refuses);
  RUN(stop_fires_what_is_queued);
  TEST_MAIN_END();
}
