#include "cache/block_hash.h"

#include <string.h>

#include "base/kv_page.h"

#define BLOCK_HASH_OFFSET 0xcbf29ce484222325ull /* FNV-1a 64 offset basis */
#define BLOCK_HASH_PRIME 0x100000001b3ull

static uint64_t block_hash_bytes(uint64_t h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= BLOCK_HASH_PRIME;
  }
  return h;
}

static uint64_t block_hash_u32(uint64_t h, uint32_t v) {
  unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 24)};
  return block_hash_bytes(h, b, 4);
}

uint64_t block_hash(uint64_t parent, const int32_t *tokens, int n, const char *salt) {
  uint64_t h = BLOCK_HASH_OFFSET;
  h = block_hash_u32(h, (uint32_t)parent);
  h = block_hash_u32(h, (uint32_t)(parent >> 32));
  h = block_hash_u32(h, (uint32_t)n);
  for (int i = 0; i < n; i++) h = block_hash_u32(h, (uint32_t)tokens[i]);
  size_t ls = salt ? strlen(salt) : 0;
  h = block_hash_u32(h, (uint32_t)ls);
  return block_hash_bytes(h, (const unsigned char *)salt, ls);
}

int block_hash_chain(const int32_t *tokens, int n_tokens, const char *salt, uint64_t *out) {
  int n = n_tokens / KV_PAGE_TOKENS;
  uint64_t h = 0;
  for (int k = 0; k < n; k++) {
    h = block_hash(h, tokens + (size_t)k * KV_PAGE_TOKENS, KV_PAGE_TOKENS, k == 0 ? salt : NULL);
    out[k] = h;
  }
  return n;
}
