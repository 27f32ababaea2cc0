/* fault — SQLite-style fault injection for allocation and copy sites.
 *
 * Every site that can fail at request time (a page or slot allocation, a checkpoint copy, a
 * request-time malloc) asks fault_hit("site") first and fails as if the resource were
 * missing when it returns 1. Tests arm the n-th hit (counting every site, or one named site)
 * and walk n upward until a run completes with no fault fired: every site has then failed
 * once, in turn. Disarmed (the default) it costs one relaxed atomic load.
 *
 * A whole process can be armed from a text spec (fault_arm_spec, used by `deltaserve serve`
 * with the test-only environment variable DS_FAULT="site:n[:sticky]"), and a hook can be told
 * of every fire (the server logs "fault fired at <site>" so that a test can see it happen). */
#ifndef DS_FAULT_H
#define DS_FAULT_H

#include <stddef.h>

/* Arms the fault: the n-th call (1-based) of fault_hit whose site matches `site`
 * (NULL: any site) returns 1; later calls return 0 again unless `sticky`. Resets the hit and
 * fire counts. Not safe against concurrent fault_arm calls (fault_hit may run concurrently). */
void fault_arm(long n, const char *site, int sticky);
void fault_disarm(void);
/* Number of fault_hit calls counted since the last fault_arm, and whether it fired. */
long fault_count(void);
int fault_fired(void);
/* Number of fault_hit calls that returned 1 since the last fault_arm (sticky faults fire
 * more than once). */
long fault_fire_count(void);
int fault_hit(const char *site);

/* Parses and arms a spec "SITE:N" or "SITE:N:sticky" (SITE "*" means any site; N >= 1;
 * the third field may also be "1" for sticky or "0" / "once" for a single fire). Returns 0, or
 * -1 with a one-line reason in err and nothing armed. */
int fault_arm_spec(const char *spec, char *err, size_t errlen);

/* Called (from whichever thread hit the site, possibly under that module's locks: keep it
 * short and lock-free apart from stdio) each time fault_hit returns 1, with the site name, the
 * hit number that fired and the number of fires so far (1 for the first). NULL removes it. */
typedef void (*fault_hook_fn)(const char *site, long hit, long fire);
void fault_set_hook(fault_hook_fn fn);

#endif
