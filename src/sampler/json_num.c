/* json_num — bounds and multipleOf over a number's text (json_num.h has the idea). Magnitudes
 * are at most 10^19 scaled, so the intervals are computed in 128-bit integers. */
#include "sampler/json_num.h"

#include <math.h>

enum { NP_START, NP_MINUS, NP_ZERO, NP_INT, NP_DOT, NP_FRAC };

typedef __int128 i128;

static i128 pow10i(int e) {
  i128 r = 1;
  while (e-- > 0) r *= 10;
  return r;
}

/* the values a..b (scaled) meet q's bounds and hold a multiple of mult */
static int meets(const json_num *q, i128 a, i128 b) {
  if (q->has_lo && a < q->lo) a = q->lo;
  if (q->has_hi && b > q->hi) b = q->hi;
  if (a > b) return 0;
  if (!q->mult) return 1;
  i128 m = q->mult, r = a % m;
  if (r < 0) r += m;
  i128 first = r ? a + (m - r) : a;
  return first <= b;
}

/* magnitudes a..b, with the sign */
static int meets_mag(const json_num *q, int neg, i128 a, i128 b) {
  return neg ? meets(q, -b, -a) : meets(q, a, b);
}

static int viable(const json_num *q, const json_num_st *st) {
  i128 s = pow10i(q->k), maxmag = pow10i(q->int_digits) * s - 1, v = (i128)st->v;
  switch (st->ph) {
    case NP_START:
      return meets(q, -maxmag, maxmag);
    case NP_MINUS:
      return meets_mag(q, 1, 0, maxmag);
    case NP_ZERO:
      return meets_mag(q, st->neg, 0, s - 1);
    case NP_INT:
      for (int j = 0; j + st->nd <= q->int_digits; j++) {
        i128 p = pow10i(j);
        if (meets_mag(q, st->neg, v * p, (v + s) * p - 1)) return 1;
      }
      return 0;
    default: /* NP_DOT, NP_FRAC */
      return meets_mag(q, st->neg, v, v + pow10i(q->k - st->nf) - 1);
  }
}

int json_num_step(const json_num *q, json_num_st *st, unsigned c) {
  int d = c >= '0' && c <= '9' ? (int)(c - '0') : -1;
  uint64_t s = (uint64_t)pow10i(q->k);
  switch (st->ph) {
    case NP_START:
      if (c == '-') {
        st->neg = 1;
        st->ph = NP_MINUS;
        break;
      }
      /* fall through */
    case NP_MINUS:
      if (d < 0) return -1;
      st->ph = d ? NP_INT : NP_ZERO;
      st->nd = 1;
      st->v = (uint64_t)d * s;
      break;
    case NP_ZERO:
    case NP_INT:
      if (c == '.' && q->k) {
        st->ph = NP_DOT;
        break;
      }
      if (d < 0 || st->ph == NP_ZERO || st->nd >= q->int_digits) return -1;
      st->v = st->v * 10 + (uint64_t)d * s;
      st->nd++;
      break;
    default: /* NP_DOT, NP_FRAC */
      if (d < 0 || st->nf >= q->k) return -1;
      st->nf++;
      st->v += (uint64_t)d * (uint64_t)pow10i(q->k - st->nf);
      st->ph = NP_FRAC;
      break;
  }
  return viable(q, st) ? 0 : -1;
}

int json_num_final(const json_num *q, const json_num_st *st) {
  if (st->ph != NP_ZERO && st->ph != NP_INT && st->ph != NP_FRAC) return 0;
  i128 v = (i128)st->v;
  return meets(q, st->neg ? -v : v, st->neg ? -v : v);
}

int json_num_any(const json_num *q) {
  json_num_st st = {0, NP_START, 0, 0, 0};
  return viable(q, &st);
}

int json_num_valid(const json_num *q, double x, int is_int, long long ix) {
  if (is_int) {
    double d = (double)ix;
    if (q->dhas_lo && (q->dlo_ex ? !(d > q->dlo) : !(d >= q->dlo))) return 0;
    if (q->dhas_hi && (q->dhi_ex ? !(d < q->dhi) : !(d <= q->dhi))) return 0;
    if (q->mult && ix % (long long)q->mult) return 0;
    return 1;
  }
  if (q->dhas_lo && (q->dlo_ex ? !(x > q->dlo) : !(x >= q->dlo))) return 0;
  if (q->dhas_hi && (q->dhi_ex ? !(x < q->dhi) : !(x <= q->dhi))) return 0;
  if (q->mult && (x != floor(x) || fmod(x, q->dmult) != 0)) return 0;
  return 1;
}
