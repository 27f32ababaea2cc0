/* kv_page — the size of a KV-cache page, in token positions: the one definition.
 *
 * Three layers must agree on it, and none includes another for it: the page allocator counts
 * positions in pages (cache/kv_pages.h, KV_PAGES_TOKENS), the backends lay their K/V pools
 * out as [n_pages, KV_PAGE_TOKENS, nkv, hd] (backend/backend.h, BACKEND_PAGE_TOKENS), and the
 * forward pass sizes page tables by it (model/qwen35.c). Those names are this constant. */
#ifndef DS_KV_PAGE_H
#define DS_KV_PAGE_H

/* Pages are the unit in which sequences share K/V (prefix-cache hits map whole pages) and a
 * power of two, so that position -> (page, row) is a shift and a mask in every kernel. */
#define KV_PAGE_TOKENS 16

#endif
