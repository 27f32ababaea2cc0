/* log — start-up and diagnostic messages on stderr, and CHECK for broken invariants.
 *
 * Failures that come from outside (files, client input, request-time memory) return status
 * codes; CHECK is only for invariants whose failure means a bug: it aborts with file and
 * line, in release builds too. */
#ifndef DS_LOG_H
#define DS_LOG_H
#include <stddef.h>

typedef enum { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR } log_level;

/* Messages below lv are dropped (default LOG_LEVEL_INFO). */
void log_set_level(log_level lv);
/* name as --log-level takes it, vLLM's and uvicorn's names: debug, info, warning (or warn),
 * error, critical (as error); any case. Returns 0 with *lv set, or -1 for another name. */
int log_level_parse(const char *name, log_level *lv);
void log_msg(log_level lv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)

void log_check_failed(const char *file, int line, const char *expr) __attribute__((noreturn));
#define CHECK(cond)                                           \
  do {                                                        \
    if (!(cond)) log_check_failed(__FILE__, __LINE__, #cond); \
  } while (0)

/* errf: formats into a caller's error buffer (err may be NULL). Returns -1 so that
 * `return errf(err, n, "...")` reads as a failure return. */
int errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
