/* fault — SQLite-style fault injection for allocation and copy sites.
 *
 * Every site that can fail at request time (a page or slot allocation, a checkpoint copy, a
 * request-time malloc) asks fault_hit("site") first and fails as if the resource were
 * missing when it returns 1. Tests arm the n-th hit (counting every site, or one named site)
 * and walk n upward until a run completes with no fault fired: every site has then failed
 * once, in turn. Disarmed (the default) it costs one relaxed atomic load. */
#ifndef DS_FAULT_H
#define DS_FAULT_H

/* Arms the fault: the n-th call (1-based) of fault_hit whose site matches `site`
 * (NULL: any site) returns 1; later calls return 0 again unless `sticky`. */
void fault_arm(long n, const char *site, int sticky);
void fault_disarm(void);
/* Number of fault_hit calls counted since the last fault_arm, and whether it fired. */
long fault_count(void);
int fault_fired(void);
int fault_hit(const char *site);

#endif
