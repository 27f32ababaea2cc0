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
  char spec[128] = "";
  if (e->spec_drafts > 0)
    snprintf(spec, sizeof spec,
             " spec_drafts=%d spec_draft_tokens=%d spec_accepted_tokens=%d acceptance_length=%.2f",
             e->spec_drafts, e->spec_draft_tokens, e->spec_accepted_tokens,
             1.0 + (double)e->spec_accepted_tokens / e->spec_drafts);
  log_info(
      "request id=%s method=%s route=%s status=%d prompt_tokens=%d cached_tokens=%d "
      "generated_tokens=%d ttft_ms=%s duration_ms=%.1f finish=%s%s",
      e->id && e->id[0] ? e->id : "-", e->method ? e->method : "-", route,
      e->status > 0 ? e->status : 499, e->prompt_tokens, e->cached_tokens, e->generated_tokens,
      ttft, e->duration_s * 1e3, e->finish ? e->finish : "-", spec);
}
