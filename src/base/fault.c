#include "base/fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int fault_armed;
static atomic_long fault_calls;
static atomic_long fault_fires;
static long fault_target;
static int fault_sticky;
static char fault_site[64];
static _Atomic(fault_hook_fn) fault_hook;

void fault_arm(long n, const char *site, int sticky) {
  atomic_store(&fault_armed, 0);
  fault_target = n;
  fault_sticky = sticky;
  fault_site[0] = 0;
  if (site) {
    strncpy(fault_site, site, sizeof fault_site - 1);
    fault_site[sizeof fault_site - 1] = 0;
  }
  atomic_store(&fault_calls, 0);
  atomic_store(&fault_fires, 0);
  atomic_store(&fault_armed, 1);
}

void fault_disarm(void) { atomic_store(&fault_armed, 0); }
long fault_count(void) { return atomic_load(&fault_calls); }
int fault_fired(void) { return atomic_load(&fault_fires) > 0; }
long fault_fire_count(void) { return atomic_load(&fault_fires); }
void fault_set_hook(fault_hook_fn fn) { atomic_store(&fault_hook, fn); }

int fault_hit(const char *site) {
  if (!atomic_load_explicit(&fault_armed, memory_order_relaxed)) return 0;
  if (fault_site[0] && strcmp(site, fault_site) != 0) return 0;
  long k = atomic_fetch_add(&fault_calls, 1) + 1;
  if (k == fault_target || (fault_sticky && k > fault_target)) {
    long f = atomic_fetch_add(&fault_fires, 1) + 1;
    fault_hook_fn fn = atomic_load(&fault_hook);
    if (fn) fn(site, k, f);
    return 1;
  }
  return 0;
}

int fault_arm_spec(const char *spec, char *err, size_t errlen) {
  const char *c1 = spec ? strchr(spec, ':') : NULL;
  if (!c1 || c1 == spec || (size_t)(c1 - spec) >= sizeof fault_site) {
    snprintf(err, errlen, "fault spec '%s': expected SITE:N[:sticky]", spec ? spec : "");
    return -1;
  }
  char site[sizeof fault_site];
  snprintf(site, sizeof site, "%.*s", (int)(c1 - spec), spec);
  char *end;
  errno = 0;
  long n = strtol(c1 + 1, &end, 10);
  if (errno || end == c1 + 1 || n < 1 || (*end && *end != ':')) {
    snprintf(err, errlen, "fault spec '%s': N must be an integer >= 1", spec);
    return -1;
  }
  int sticky = 0;
  if (*end == ':') {
    const char *m = end + 1;
    if (!strcmp(m, "sticky") || !strcmp(m, "1"))
      sticky = 1;
    else if (strcmp(m, "once") && strcmp(m, "0")) {
      snprintf(err, errlen, "fault spec '%s': the third field must be 'sticky' or 'once'", spec);
      return -1;
    }
  }
  fault_arm(n, strcmp(site, "*") ? site : NULL, sticky);
  return 0;
}
