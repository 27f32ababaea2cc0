#include "base/fault.h"

#include <stdatomic.h>
#include <string.h>

static atomic_int fault_armed;
static atomic_long fault_calls;
static atomic_int fault_did_fire;
static long fault_target;
static int fault_sticky;
static char fault_site[64];

void fault_arm(long n, const char *site, int sticky) {
  fault_target = n;
  fault_sticky = sticky;
  fault_site[0] = 0;
  if (site) {
    strncpy(fault_site, site, sizeof fault_site - 1);
    fault_site[sizeof fault_site - 1] = 0;
  }
  atomic_store(&fault_calls, 0);
  atomic_store(&fault_did_fire, 0);
  atomic_store(&fault_armed, 1);
}

void fault_disarm(void) { atomic_store(&fault_armed, 0); }
long fault_count(void) { return atomic_load(&fault_calls); }
int fault_fired(void) { return atomic_load(&fault_did_fire); }

int fault_hit(const char *site) {
  if (!atomic_load_explicit(&fault_armed, memory_order_relaxed)) return 0;
  if (fault_site[0] && strcmp(site, fault_site) != 0) return 0;
  long k = atomic_fetch_add(&fault_calls, 1) + 1;
  if (k == fault_target || (fault_sticky && k > fault_target)) {
    atomic_store(&fault_did_fire, 1);
    return 1;
  }
  return 0;
}
