/* spec_replay — see spec_replay.h. */
#include "engine/spec_replay.h"

/* A corruption draw in [0, 1000): splitmix64's finaliser over the request id and position. */
static int spec_replay_draw(int64_t id, int pos) {
  uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull + (uint64_t)pos * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (int)(x % 1000);
}

int spec_replay_propose(const int32_t *replay, int n_replay, int64_t id, int pos, int pm, int k,
                        int32_t *out) {
  int d = 0;
  for (; d < k && pos + d < n_replay; d++) {
    int32_t t = replay[pos + d];
    if (spec_replay_draw(id, pos + d) < pm) t = t > 0 ? t - 1 : t + 1;
    out[d] = t;
  }
  return d;
}
