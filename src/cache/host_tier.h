/* host_tier — copies of prefix-cache checkpoints in host memory, for those that no longer fit
 * on the device.
 *
 * An entry is one host allocation holding an optional state slab image and zero or more KV
 * page images, read out through the ops (in the engine: qwen35_slot_read / qwen35_page_read)
 * and written back into a state slot / fresh pages (qwen35_slot_write / qwen35_page_write):
 *
 *   entry  [ slab image (slot_bytes) | page 0 | page 1 | ... | page n-1 ]  (page_bytes each)
 *
 * The store keeps a byte budget that is never exceeded (a put that does not fit is refused;
 * the prefix cache makes room by dropping its least recently used host checkpoints) and a
 * use tick per entry (host_tier_touch / host_tier_oldest) for LRU. Entries are named by small
 * integer handles >= 0; the prefix cache is the only owner of each entry it puts. */
#ifndef DS_HOST_TIER_H
#define DS_HOST_TIER_H
#include <stddef.h>
#include <stdint.h>

typedef struct host_tier host_tier;

typedef struct host_tier_ops {
  void *ctx;
  int (*page_read)(void *ctx, int page, void *host);
  int (*page_write)(void *ctx, int page, const void *host);
  int (*slot_read)(void *ctx, int slot, void *host);
  int (*slot_write)(void *ctx, int slot, const void *host);
} host_tier_ops;

/* Creates an empty store of budget bytes. ops is copied (NULL members: copies do nothing).
 * Returns 0, or -1 on out of memory (start-up only). */
int host_tier_init(host_tier **out, size_t budget, size_t slot_bytes, size_t page_bytes,
                   const host_tier_ops *ops);
/* Frees every entry and the store. */
void host_tier_free(host_tier *ht);

size_t host_tier_budget(const host_tier *ht);
size_t host_tier_bytes(const host_tier *ht); /* held by live entries */
int host_tier_count(const host_tier *ht);
/* Bytes an entry with (has_slot, n_pages) takes. */
size_t host_tier_entry_size(const host_tier *ht, int has_slot, int n_pages);

/* Copies slot (or none when slot < 0) and pages[0, n_pages) into a new entry. Returns 0 with
 * *entry, or -1 when it does not fit the budget, the allocation fails (fault site
 * "host_tier_alloc") or a read fails (fault site "host_tier_read"); nothing is kept then. */
int host_tier_put(host_tier *ht, int slot, const int32_t *pages, int n_pages, int *entry);
/* Writes the entry's slab image into slot (fault site "host_tier_write"). Returns 0 or -1. */
int host_tier_write_slot(host_tier *ht, int entry, int slot);
/* Writes the entry's page images into pages[0, n_pages) (n_pages = the entry's; fault site
 * "host_tier_write" once per call). Returns 0 or -1. */
int host_tier_write_pages(host_tier *ht, int entry, const int32_t *pages, int n_pages);
/* Frees an entry. */
void host_tier_drop(host_tier *ht, int entry);
/* Marks an entry most recently used. */
void host_tier_touch(host_tier *ht, int entry);
/* The least recently used live entry, or -1 when empty. */
int host_tier_oldest(const host_tier *ht);
/* The entry's image (slab image, then the page images), borrowed until the entry is dropped;
 * NULL when the handle is not live. */
const void *host_tier_entry_data(const host_tier *ht, int entry);
/* Entry facts; -1 / 0 when the handle is not live. */
int host_tier_live(const host_tier *ht, int entry);
int host_tier_entry_pages(const host_tier *ht, int entry);
int host_tier_entry_has_slot(const host_tier *ht, int entry);

/* Verifies the byte count and the budget; returns 0, or -1 with one line in err. */
int host_tier_check(const host_tier *ht, char *err, size_t errlen);

#endif
