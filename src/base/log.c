#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static log_level log_min = LOG_LEVEL_INFO;

void log_set_level(log_level lv) { log_min = lv; }

int log_level_parse(const char *name, log_level *lv) {
  static const struct {
    const char *name;
    log_level lv;
  } names[] = {{"debug", LOG_LEVEL_DEBUG},  {"info", LOG_LEVEL_INFO},
               {"warning", LOG_LEVEL_WARN}, {"warn", LOG_LEVEL_WARN},
               {"error", LOG_LEVEL_ERROR},  {"critical", LOG_LEVEL_ERROR}};
  for (size_t k = 0; k < sizeof names / sizeof *names; k++)
    if (!strcasecmp(name, names[k].name)) {
      *lv = names[k].lv;
      return 0;
    }
  return -1;
}

void log_msg(log_level lv, const char *fmt, ...) {
  if (lv < log_min) return;
  static const char *tag[] = {"debug", "info", "warn", "error"};
  va_list ap;
  va_start(ap, fmt);
  flockfile(stderr); /* one line whole, whichever threads log at once */
  fprintf(stderr, "deltaserve %s: ", tag[lv]);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  funlockfile(stderr);
  va_end(ap);
}

void log_check_failed(const char *file, int line, const char *expr) {
  fprintf(stderr, "deltaserve: CHECK failed at %s:%d: %s\n", file, line, expr);
  abort();
}

int errf(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    /* one line, whatever the input put into it (names come from files and clients) */
    for (char *p = err; *p; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  }
  return -1;
}
