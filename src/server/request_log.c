/* request_log — see request_log.h. */
#include "server/request_log.h"

#include <stdio.h>

#include "base/log.h"

void request_log_write(const request_log_entry *e) {
  char route[160];
  size_t n = 0;
  for (const char *p = e->route ? e->route : "-"; *p && n + 1 < sizeof route; p++)
    route[n++] = (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f ? *p : '?';
  route[n] = 0;
  char ttft[32] = "-";
  if (e->ttft_s >= 0) snprintf(ttft, sizeof ttft, "%.1f", e->ttft_s * 1e3);
  log_info(
      "request id=%s method=%s route=%s status=%d prompt_tokens=%d cached_tokens=%d "
      "generated_tokens=%d ttft_ms=%s duration_ms=%.1f finish=%s",
      e->id && e->id[0] ? e->id : "-", e->method ? e->method : "-", route,
      e->status > 0 ? e->status : 499, e->prompt_tokens, e->cached_tokens, e->generated_tokens,
      ttft, e->duration_s * 1e3, e->finish ? e->finish : "-");
}
