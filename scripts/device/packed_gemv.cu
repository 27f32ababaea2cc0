/* packed_gemv — the products of a one-sequence decode step from the lossless 12-bit copy of the
 * weights (src/backend/cuda/cuda_packed.cuh) against the bf16 rows.
 *
 * The step's 128 products at the 4B shape (as scripts/device/gemv_ceiling.cu: per layer the
 * input projections, out, gate+up as one product, down), with weights drawn as `deltaserve
 * gen-random` draws them (uniform, std 0.02, rounded to bf16). Prints: the share of escaping
 * turns (read from the bf16 rows) for those weights and for normal ones of the same std; whether
 * every packed row's sum has exactly the bf16 row's bits (all 128 products); and the step's
 * products back to back in one graph (programmatic launch, the backend's block shapes), per
 * design and per product class, medians of alternating rounds: bf16 rows, packed rows with one
 * or two turns in flight, and a grid-stride read of either copy's bytes. Run on the GPU machine
 * with `bash scripts/device/ceiling.sh packed_gemv`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_packed.cuh"

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "packed_gemv: %s (line %d)\n", cudaGetErrorString(e_), __LINE__); \
      exit(2);                                                                          \
    }                                                                                   \
  } while (0)

__device__ __forceinline__ unsigned pg_hash(unsigned long long i, unsigned seed) {
  unsigned h = (unsigned)(i ^ (i >> 32)) * 2654435761u ^ seed * 0x9e3779b9u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  h *= 3266489917u;
  h ^= h >> 16;
  return h;
}

/* gen-random's matrices: uniform in [-a, a), a = 0.02 sqrt(3); normal: std 0.02 (Box-Muller). */
__global__ void pg_fill(unsigned short *w, size_t n, unsigned seed, int normal) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float u = (float)(pg_hash(i, seed) >> 8) * (1.0f / 16777216.0f);
    float f;
    if (normal) {
      float v = ((float)(pg_hash(i, seed + 7777u) >> 8) + 1.0f) * (1.0f / 16777217.0f);
      f = 0.02f * sqrtf(-2.0f * logf(v)) * cospif(2.0f * u);
    } else {
      f = 0.02f * 1.7320508f * (2.0f * u - 1.0f);
    }
    unsigned b = __float_as_uint(f);
    b += 0x7fffu + ((b >> 16) & 1u);
    w[i] = (unsigned short)(b >> 16);
  }
}

struct pg_prod {
  const bf16 *W;
  const uint8_t *pk;
  const uint32_t *hd;
  int N, K;
};

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) pg_bf(const bf16 *x, pg_prod p, float *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  pdl_enter();
  if (n >= p.N) return;
  float acc[1];
  gemv_row<1>(x, p.W + (size_t)n * p.K, p.K, lane, acc);
  if (lane == 0) y[n] = acc[0];
}

template <int WARPS, int UT>
__global__ void __launch_bounds__(WARPS * 32) pg_pk(const bf16 *x, pg_prod p, float *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  pdl_enter();
  if (n >= p.N) return;
  float acc[1];
  pk_row<1, false, UT>(x, p.W + (size_t)n * p.K, p.pk + pk_bytes(n, p.K), p.hd + n, p.K, lane, acc);
  if (lane == 0) y[n] = acc[0];
}

/* gate+up as the glu reads it: rows n and n + N / 2 of the product in one loop */
template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) pg_bf2(const bf16 *x, pg_prod p, float *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, h = p.N / 2;
  pdl_enter();
  if (n >= h) return;
  float a[1], b[1];
  gemv_row2<1>(x, p.W + (size_t)n * p.K, p.W + (size_t)(n + h) * p.K, p.K, lane, a, b);
  if (lane == 0) {
    y[n] = a[0];
    y[n + h] = b[0];
  }
}

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) pg_pk2(const bf16 *x, pg_prod p, float *y) {
  int n = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, h = p.N / 2;
  pdl_enter();
  if (n >= h) return;
  float a[1], b[1];
  pk_view va = {p.W, p.pk, p.hd}, vb = {p.W + (size_t)h * p.K, p.pk + pk_bytes(h, p.K), p.hd + h};
  pk_gemv_row2<1>(x, va, vb, n, p.K, lane, a, b);
  if (lane == 0) {
    y[n] = a[0];
    y[n + h] = b[0];
  }
}

/* A grid-stride read of the bf16 (PK = 0) or packed (1) bytes: the ceiling. */
template <int PK>
__global__ void __launch_bounds__(256) pg_read(const bf16 *x, pg_prod p, float *y) {
  pdl_enter();
  size_t n16 = PK ? pk_bytes(p.N, p.K) / 16 : (size_t)p.N * p.K / 8;
  const uint4 *q = PK ? (const uint4 *)p.pk : (const uint4 *)p.W;
  unsigned acc = 0;
  for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n16; i += (size_t)gridDim.x * 256) {
    uint4 u = ld_stream16(q + i);
    acc ^= u.x ^ u.y ^ u.z ^ u.w;
  }
  if (acc == 0x9e3779b9u) y[0] = bf2f(x[0]); /* never: keeps the loads */
}

typedef void (*pg_kernel)(const bf16 *, pg_prod, float *);

struct pg_design {
  const char *name;
  pg_kernel big, small; /* products of > 4,096 rows (4-warp blocks) / the others (1 warp) */
  int wb, ws, resident, packed;
  pg_kernel glu; /* gate+up (the class of shape 2) as two rows a warp; NULL: big */
};

static cudaLaunchConfig_t pg_config(unsigned grid, unsigned block, cudaStream_t st,
                                    cudaLaunchAttribute *at) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.stream = st;
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cfg;
}

static cudaGraphExec_t pg_graph(const pg_design &d, int nsm, cudaStream_t st, const bf16 *x,
                                const std::vector<pg_prod> &ps, float *y, unsigned mask) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (size_t i = 0; i < ps.size(); i++) {
    if (!(mask >> (i % 4) & 1)) continue;
    const pg_prod &p = ps[i];
    int small = p.N <= 4096, warps = d.resident ? 8 : small ? d.ws : d.wb;
    pg_kernel f = small ? d.small : d.big;
    unsigned grid = (unsigned)((p.N + warps - 1) / warps);
    if (i % 4 == 2 && d.glu) {
      f = d.glu;
      grid = (unsigned)((p.N / 2 + warps - 1) / warps);
    }
    if (d.resident) {
      int occ;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, f, 256, 0));
      grid = (unsigned)(nsm * occ);
      warps = 8;
    }
    cudaLaunchAttribute at[1];
    cudaLaunchConfig_t cfg = pg_config(grid, (unsigned)(warps * 32), st, at);
    CK(cudaLaunchKernelEx(&cfg, f, x, p, y));
  }
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

static double pg_time(cudaStream_t st, cudaGraphExec_t ge) {
  for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int R = 20;
  CK(cudaEventRecord(a, st));
  for (int r = 0; r < R; r++) CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(b, st));
  CK(cudaStreamSynchronize(st));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / R;
}

/* y's floats into v, after the work queued on st (a non-blocking stream: a plain cudaMemcpy
 * on the legacy stream would not wait for it). */
static void pg_get(std::vector<float> &v, const float *y, cudaStream_t st) {
  CK(cudaMemcpyAsync(v.data(), y, v.size() * 4, cudaMemcpyDeviceToHost, st));
  CK(cudaStreamSynchronize(st));
}

/* Packs p (its W filled): header and copy. */
static void pg_pack(pg_prod &p, cudaStream_t st) {
  uint32_t *hd;
  uint8_t *pk;
  CK(cudaMalloc(&hd, (size_t)p.N * 4));
  CK(cudaMalloc(&pk, pk_bytes(p.N, p.K)));
  CK(cudaMemsetAsync(pk, 0xA5, pk_bytes(p.N, p.K), st)); /* poison: every byte must be written */
  k_pk_base<<<(p.N + 7) / 8, 256, 0, st>>>(p.W, p.N, p.K, hd);
  size_t pieces = (size_t)p.N * p.K / 8;
  k_pk_encode<<<(unsigned)((pieces + 255) / 256), 256, 0, st>>>(p.W, p.N, p.K, hd, pk);
  CK(cudaGetLastError());
  p.pk = pk;
  p.hd = hd;
}

/* Escaping turns of p's header: (turns, escaping). */
static void pg_escapes(const pg_prod &p, long long *turns, long long *esc) {
  std::vector<uint32_t> h(p.N);
  CK(cudaMemcpy(h.data(), p.hd, (size_t)p.N * 4, cudaMemcpyDeviceToHost));
  int nt = (p.K + PK_TURN - 1) / PK_TURN;
  for (int n = 0; n < p.N; n++) {
    *turns += nt;
    *esc += __builtin_popcount(h[n] >> 8);
  }
}

int main(int argc, char **argv) {
  const char *json = NULL;
  for (int a = 1; a + 1 < argc; a += 2)
    if (!strcmp(argv[a], "--json")) json = argv[a + 1];
  int nsm;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  FILE *jf = json ? fopen(json, "w") : NULL;
  printf("packed_gemv: %s\n", prop.name);
  if (jf) fprintf(jf, "{\"gpu\": \"%s\"", prop.name);

  /* escapes for normal weights of the four shapes */
  {
    int shapes[4][2] = {{12352, 2560}, {2560, 4096}, {18432, 2560}, {2560, 9216}};
    long long turns = 0, esc = 0;
    for (int s = 0; s < 4; s++) {
      pg_prod p = {NULL, NULL, NULL, shapes[s][0], shapes[s][1]};
      CK(cudaMalloc((void **)&p.W, (size_t)p.N * p.K * 2));
      pg_fill<<<2048, 256, 0, st>>>((unsigned short *)p.W, (size_t)p.N * p.K, 99u + s, 1);
      pg_pack(p, st);
      CK(cudaStreamSynchronize(st));
      pg_escapes(p, &turns, &esc);
      CK(cudaFree((void *)p.W));
      CK(cudaFree((void *)p.pk));
      CK(cudaFree((void *)p.hd));
    }
    printf("normal weights (std 0.02): %lld of %lld turns escape (%.3f %%)\n", esc, turns,
           100.0 * esc / turns);
    if (jf) fprintf(jf, ", \"normal_escaping_turns\": %.6f", (double)esc / turns);
  }

  std::vector<pg_prod> ps;
  double bytes = 0, pbytes = 0;
  for (int l = 0; l < 32; l++) {
    int in_rows = l % 4 == 3 ? 10240 : 12352;
    int shapes[4][2] = {{in_rows, 2560}, {2560, 4096}, {18432, 2560}, {2560, 9216}};
    for (int s = 0; s < 4; s++) {
      pg_prod p = {NULL, NULL, NULL, shapes[s][0], shapes[s][1]};
      size_t b = (size_t)p.N * p.K * 2;
      CK(cudaMalloc((void **)&p.W, b));
      pg_fill<<<2048, 256, 0, st>>>((unsigned short *)p.W, b / 2, (unsigned)(l * 4 + s), 0);
      pg_pack(p, st);
      bytes += (double)b;
      pbytes += (double)pk_bytes(p.N, p.K) + 4.0 * p.N;
      ps.push_back(p);
    }
  }
  CK(cudaStreamSynchronize(st));
  long long turns = 0, esc = 0;
  for (const pg_prod &p : ps) pg_escapes(p, &turns, &esc);
  printf(
      "uniform weights (gen-random): %lld of %lld turns escape (%.3f %%); %.3f GB bf16, %.3f GB "
      "packed + headers\n",
      esc, turns, 100.0 * esc / turns, bytes / 1e9, pbytes / 1e9);
  if (jf)
    fprintf(jf, ", \"uniform_escaping_turns\": %.6f, \"bf16_bytes\": %.0f, \"packed_bytes\": %.0f",
            (double)esc / turns, bytes, pbytes);

  bf16 *x;
  float *ya, *yb;
  CK(cudaMalloc(&x, 1 << 20));
  pg_fill<<<256, 256, 0, st>>>((unsigned short *)x, (1 << 20) / 2, 977u, 1);
  CK(cudaMalloc(&ya, 1 << 20));
  CK(cudaMalloc(&yb, 1 << 20));

  /* the same bits: every product, bf16 rows against packed rows (1 and 2 turns in flight) */
  long long rows = 0, same1 = 0, same2 = 0, rows_glu = 0, same_glu = 0;
  for (size_t pi = 0; pi < ps.size(); pi++) {
    const pg_prod &p = ps[pi];
    pg_bf<4><<<(p.N + 3) / 4, 128, 0, st>>>(x, p, ya);
    std::vector<float> a(p.N), b(p.N);
    pg_get(a, ya, st);
    for (int ut = 1; ut <= 2; ut++) {
      CK(cudaMemsetAsync(yb, 0xFF, (size_t)p.N * 4, st));
      if (ut == 1)
        pg_pk<4, 1><<<(p.N + 3) / 4, 128, 0, st>>>(x, p, yb);
      else
        pg_pk<4, 2><<<(p.N + 3) / 4, 128, 0, st>>>(x, p, yb);
      CK(cudaGetLastError());
      pg_get(b, yb, st);
      for (int n = 0; n < p.N; n++) (ut == 1 ? same1 : same2) += !memcmp(&a[n], &b[n], 4);
    }
    if (pi % 4 == 2) { /* the glu's two rows a warp */
      CK(cudaMemsetAsync(yb, 0xFF, (size_t)p.N * 4, st));
      pg_pk2<4><<<(p.N / 2 + 3) / 4, 128, 0, st>>>(x, p, yb);
      CK(cudaGetLastError());
      pg_get(b, yb, st);
      for (int n = 0; n < p.N; n++) same_glu += !memcmp(&a[n], &b[n], 4);
      rows_glu += p.N;
    }
    rows += p.N;
  }
  printf("bits: glu rows (two a warp) equal to bf16 rows: %lld / %lld\n", same_glu, rows_glu);
  printf("bits: packed rows equal to bf16 rows: %lld / %lld (1 turn in flight), %lld / %lld (2)\n",
         same1, rows, same2, rows);
  if (jf)
    fprintf(jf, ", \"rows\": %lld, \"same_ut1\": %lld, \"same_ut2\": %lld", rows, same1, same2);

  const pg_design ds[] = {
      {"bf16 rows (backend: 4 warps, singles 1)", pg_bf<4>, pg_bf<1>, 4, 1, 0, 0},
      {"bf16 rows, glu two rows a warp (backend)", pg_bf<4>, pg_bf<1>, 4, 1, 0, 0, pg_bf2<4>},
      {"packed rows, glu two rows a warp", pg_pk<4, 1>, pg_pk<1, 1>, 4, 1, 0, 1, pg_pk2<4>},
      {"packed rows, 1 turn in flight", pg_pk<4, 1>, pg_pk<1, 1>, 4, 1, 0, 1},
      {"packed rows, 2 turns in flight", pg_pk<4, 2>, pg_pk<1, 2>, 4, 1, 0, 1},
      {"packed rows, 1 turn, 2-warp singles", pg_pk<4, 1>, pg_pk<2, 1>, 4, 2, 0, 1},
      {"grid-stride read, bf16 bytes", pg_read<0>, pg_read<0>, 8, 8, 1, 0},
      {"grid-stride read, packed bytes", pg_read<1>, pg_read<1>, 8, 8, 1, 1},
  };
  const int ND = sizeof ds / sizeof ds[0], NM = 5, R = 7;
  const unsigned masks[NM] = {15u, 1u, 2u, 4u, 8u};
  const char *mname[NM] = {"step", "input", "out", "gate+up", "down"};
  double mcount[NM] = {0};
  for (size_t i = 0; i < ps.size(); i++)
    for (int m = 0; m < NM; m++)
      if (masks[m] >> (i % 4) & 1) mcount[m] += 1;
  std::vector<cudaGraphExec_t> ge(ND * NM);
  for (int d = 0; d < ND; d++)
    for (int m = 0; m < NM; m++) ge[d * NM + m] = pg_graph(ds[d], nsm, st, x, ps, ya, masks[m]);
  std::vector<double> ms(ND * NM * R);
  for (int r = 0; r < R; r++)
    for (int m = 0; m < NM; m++)
      for (int d = 0; d < ND; d++) ms[(d * NM + m) * R + r] = pg_time(st, ge[d * NM + m]);
  printf(
      "products back to back (median of %d alternating rounds; step ms, else us per product; "
      "bf16-equivalent TB/s = bf16 bytes / time):\n",
      R);
  printf("  %-40s", "");
  for (int m = 0; m < NM; m++) printf(" %16s", mname[m]);
  printf("\n");
  if (jf) fprintf(jf, ", \"designs\": [");
  for (int d = 0; d < ND; d++) {
    printf("  %-40s", ds[d].name);
    if (jf) fprintf(jf, "%s{\"design\": \"%s\"", d ? ", " : "", ds[d].name);
    for (int m = 0; m < NM; m++) {
      double mb = 0;
      for (size_t i = 0; i < ps.size(); i++)
        if (masks[m] >> (i % 4) & 1) mb += 2.0 * ps[i].N * ps[i].K;
      std::vector<double> s(&ms[(d * NM + m) * R], &ms[(d * NM + m) * R] + R);
      std::sort(s.begin(), s.end());
      double med = s[R / 2], tbs = mb / (med * 1e-3) / 1e12;
      if (m == 0)
        printf(" %7.3f ms %4.2f", med, tbs);
      else
        printf(" %7.2f us %4.2f", med * 1e3 / mcount[m], tbs);
      if (jf) fprintf(jf, ", \"%s_ms\": %.4f", mname[m], med);
    }
    printf("\n");
    if (jf) fprintf(jf, "}");
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  for (cudaGraphExec_t g : ge) CK(cudaGraphExecDestroy(g));
  return 0;
}
