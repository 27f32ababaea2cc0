/* block_hash — the 64-bit hash chain that names a 16-token KV block in the KV-cache events.
 *
 * A router computes the same numbers from a prompt's token ids (docs/kv-events.md gives the
 * byte layout and a Python version): block k of a prompt is named
 *
 *   h[0] = block_hash(0, tokens[0..16), cache_salt)
 *   h[k] = block_hash(h[k-1], tokens[16k..16k+16), NULL)
 *
 * so a block's name covers every token before it (a prefix match on names is a prefix match
 * on tokens) and the salt enters through the first block only, as vLLM's extra keys do. The
 * hash is FNV-1a 64 over
 *
 *   parent (u64 LE) | n (u32 LE) | n tokens (u32 LE each) | salt length (u32 LE) | salt bytes
 *
 * (salt length 0 when the salt is NULL or ""). It names blocks for routing only: the prefix
 * cache itself compares token ids, so a collision can misroute a request, never hand it
 * another prompt's KV. */
#ifndef DS_BLOCK_HASH_H
#define DS_BLOCK_HASH_H
#include <stdint.h>

/* The hash of n tokens after a block named parent (0 for the first block); salt (NULL or ""
 * for the shared namespace) is given for the first block only. Never fails. */
uint64_t block_hash(uint64_t parent, const int32_t *tokens, int n, const char *salt);

/* The names of the n_tokens / 16 full blocks of tokens into out (caller's array). Returns
 * how many were written. */
int block_hash_chain(const int32_t *tokens, int n_tokens, const char *salt, uint64_t *out);

#endif
