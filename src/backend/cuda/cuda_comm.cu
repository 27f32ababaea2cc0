/* cuda_comm — see cuda_comm.h. */
#include "backend/cuda/cuda_comm.h"

#if DS_NCCL
#include <nccl.h>
#else
typedef void *ncclComm_t; /* a build without NCCL: the NCCL communicator is refused */
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <new>

#include "backend/cuda/cuda_common.cuh"

struct cuda_comm {
  int n;
  cuda_comm_kind kind; /* NCCL or LOCAL */
  std::atomic<int> refs;
  int dev[CUDA_COMM_MAX];
  /* NCCL: one communicator per rank, made together (ncclCommInitAll) */
  ncclComm_t nccl[CUDA_COMM_MAX];
  int nccl_up;
  /* local: the host barrier, the buffers posted for the collective in progress, the events */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int waiting;
  unsigned gen;
  void *buf[CUDA_COMM_MAX];          /* rank r's input (the all-reduce's: also its output) */
  void *obuf[CUDA_COMM_MAX];         /* rank r's output (all-gather) */
  cudaEvent_t ev_in[CUDA_COMM_MAX];  /* rank r's input is written */
  cudaEvent_t ev_out[CUDA_COMM_MAX]; /* rank r's part of the collective is written */
  long long vote[CUDA_COMM_MAX];     /* rank r's value in the agreement in progress */
};

static void comm_free(cuda_comm *m) {
  if (!m) return;
  for (int r = 0; r < m->n; r++) {
#if DS_NCCL
    if (m->nccl_up && m->nccl[r]) ncclCommDestroy(m->nccl[r]);
#endif
    if (m->ev_in[r]) cudaEventDestroy(m->ev_in[r]);
    if (m->ev_out[r]) cudaEventDestroy(m->ev_out[r]);
  }
  cudaGetLastError();
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  delete m;
}

void cuda_comm_release(cuda_ctx *c) {
  cuda_comm *m = c->comm;
  if (!m) return;
  c->comm = NULL;
  if (m->refs.fetch_sub(1) == 1) comm_free(m);
}

extern "C" const char *cuda_comm_kind_name(backend *be) {
  cuda_comm *m = cuda_ctx_of(be)->comm;
  if (!m) return NULL;
  return m->kind == CUDA_COMM_NCCL ? "nccl" : "local";
}

/* Returns once every rank has called it (orders the ranks' issuing, not their devices). */
static void comm_barrier(cuda_comm *m) {
  pthread_mutex_lock(&m->mu);
  unsigned gen = m->gen;
  if (++m->waiting == m->n) {
    m->waiting = 0;
    m->gen++;
    pthread_cond_broadcast(&m->cv);
  } else {
    while (gen == m->gen) pthread_cond_wait(&m->cv, &m->mu);
  }
  pthread_mutex_unlock(&m->mu);
}

int cuda_comm_records(const cuda_ctx *c) { return c->comm && c->comm->kind == CUDA_COMM_NCCL; }

long long cuda_comm_agree(cuda_ctx *c, long long v, long long *hi) {
  cuda_comm *m = c->comm;
  *hi = v;
  if (!m || m->n == 1) return v;
  pthread_mutex_lock(&m->mu);
  m->vote[c->comm_rank] = v;
  pthread_mutex_unlock(&m->mu);
  comm_barrier(m);
  long long lo = v;
  pthread_mutex_lock(&m->mu);
  for (int k = 0; k < m->n; k++) {
    if (m->vote[k] < lo) lo = m->vote[k];
    if (m->vote[k] > *hi) *hi = m->vote[k];
  }
  pthread_mutex_unlock(&m->mu);
  comm_barrier(m); /* every rank read the values before any posts its next one */
  return lo;
}

struct comm_bufs {
  bf16 *p[CUDA_COMM_MAX];
};

/* Elements [b, e) of the sum: fp32 in rank order, rounded once, written to every rank's buffer.
 * Launched as issued (an all-reduce is never inside a graph), so no pdl_enter. */
__global__ void k_comm_sum(comm_bufs a, int n_ranks, size_t b, size_t e) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = b + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < e; i += stride) {
    float s = bf2f(a.p[0][i]);
    for (int r = 1; r < n_ranks; r++) s += bf2f(a.p[r][i]);
    bf16 v = f2bf(s);
    for (int r = 0; r < n_ranks; r++) a.p[r][i] = v;
  }
}

static void ck_ev(cuda_ctx *c, const char *what, cudaError_t e) {
  if (e != cudaSuccess) cuda_fail(c, what, cudaGetErrorString(e));
}

/* What rank c issues in the middle of a device-local collective, every rank's buffers posted
 * (in[k], out[k]: rank k's) and their inputs written. */
typedef void (*local_part)(cuda_ctx *c, int n_ranks, void *const *in, void *const *out, size_t n);

/* A device-local collective (cuda_comm.h "How the ranks' streams meet"). Every rank takes part
 * in both barriers even after a failure of its own, so that no other rank waits forever. */
static void local_collective(cuda_ctx *c, cuda_comm *m, const char *what, void *x, void *out,
                             size_t n, local_part part) {
  int r = c->comm_rank, N = m->n;
  ck_ev(c, what, cudaEventRecord(m->ev_in[r], c->st));
  pthread_mutex_lock(&m->mu);
  m->buf[r] = x;
  m->obuf[r] = out;
  pthread_mutex_unlock(&m->mu);
  comm_barrier(m);
  void *in[CUDA_COMM_MAX], *outs[CUDA_COMM_MAX];
  pthread_mutex_lock(&m->mu);
  for (int k = 0; k < N; k++) {
    in[k] = m->buf[k];
    outs[k] = m->obuf[k];
  }
  pthread_mutex_unlock(&m->mu);
  for (int k = 0; k < N; k++)
    if (k != r) ck_ev(c, what, cudaStreamWaitEvent(c->st, m->ev_in[k], 0));
  part(c, N, in, outs, n); /* also after a failure of this rank's: the others wait for it */
  ck_ev(c, what, cudaEventRecord(m->ev_out[r], c->st));
  comm_barrier(m);
  for (int k = 0; k < N; k++)
    if (k != r) ck_ev(c, what, cudaStreamWaitEvent(c->st, m->ev_out[k], 0));
}

/* The all-reduce's part: this rank's 1/N of the elements, summed into every rank's buffer. */
static void sum_part(cuda_ctx *c, int N, void *const *in, void *const *out, size_t n) {
  (void)out;
  int r = c->comm_rank;
  comm_bufs a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < N; k++) a.p[k] = (bf16 *)in[k];
  size_t b = n * (size_t)r / (size_t)N, e = n * (size_t)(r + 1) / (size_t)N;
  if (e <= b) return;
  size_t blocks = (e - b + 255) / 256;
  if (blocks > 1024) blocks = 1024;
  void (*kern)(comm_bufs, int, size_t, size_t) = k_comm_sum;
  kern<<<(unsigned)blocks, 256, 0, c->st>>>(a, N, b, e);
  cuda_check_launch(c, "all_reduce_sum");
}

/* The all-gather's part: every rank's input into this rank's output, in rank order. */
static void gather_part(cuda_ctx *c, int N, void *const *in, void *const *out, size_t n) {
  float *dst = (float *)out[c->comm_rank];
  for (int k = 0; k < N; k++)
    ck_ev(c, "all_gather",
          cudaMemcpyAsync(dst + (size_t)k * n, in[k], n * sizeof(float), cudaMemcpyDeviceToDevice,
                          c->st));
}

#if DS_NCCL
/* The NCCL collectives as ops (a recorded step holds them: cuda_graph_rec_collective). Issued
 * even after a failure of this rank's: the other ranks' collectives wait for them. */
static void nccl_all_reduce(backend *be, backend_buf x, size_t n, backend_buf out) {
  (void)out;
  cuda_ctx *c = cuda_ctx_of(be);
  ncclResult_t e =
      ncclAllReduce(x, x, n, ncclBfloat16, ncclSum, c->comm->nccl[c->comm_rank], c->st);
  if (e != ncclSuccess) cuda_fail(c, "all_reduce_sum (NCCL)", ncclGetErrorString(e));
}

static void nccl_all_gather(backend *be, backend_buf x, size_t n, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  ncclResult_t e = ncclAllGather(x, out, n, ncclFloat32, c->comm->nccl[c->comm_rank], c->st);
  if (e != ncclSuccess) cuda_fail(c, "all_gather (NCCL)", ncclGetErrorString(e));
}
#endif

/* The signature ids of the recorded collectives (cuda_graph.cu's ops take 1..18). */
enum { REC_ALL_REDUCE = 40, REC_ALL_GATHER = 41 };

/* backend.h all_reduce_sum: x ACT (bf16) [n]. */
static void cu_all_reduce_sum(backend *be, backend_buf x, size_t n) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_comm *m = c->comm;
  if (m->kind == CUDA_COMM_LOCAL && m->n == 1) return; /* a sum of one: nothing to do */
  if (m->kind == CUDA_COMM_LOCAL) {
    cuda_graph_stop(c); /* cuda_comm.h "CUDA graphs" */
    local_collective(c, m, "all_reduce_sum", x, NULL, n, sum_part);
    return;
  }
#if DS_NCCL
  if (!cuda_graph_rec_collective(c, REC_ALL_REDUCE, nccl_all_reduce, x, n, NULL))
    nccl_all_reduce(be, x, n, NULL);
#endif
}

/* backend.h all_gather: x F32 [n], out F32 [N * n]. */
static void cu_all_gather(backend *be, backend_buf x, size_t n, backend_buf out) {
  cuda_ctx *c = cuda_ctx_of(be);
  cuda_comm *m = c->comm;
  if (m->kind == CUDA_COMM_LOCAL) {
    cuda_graph_stop(c); /* as for the all-reduce */
    local_collective(c, m, "all_gather", x, out, n, gather_part);
    return;
  }
#if DS_NCCL
  if (!cuda_graph_rec_collective(c, REC_ALL_GATHER, nccl_all_gather, x, n, out))
    nccl_all_gather(be, x, n, out);
#endif
}

__attribute__((format(printf, 3, 4))) static int fail_msg(char *err, size_t errlen, const char *fmt,
                                                          ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

extern "C" int cuda_comm_create_ranks(int n, cuda_comm_kind kind, const backend_options *opt,
                                      const backend_cuda_test *t, backend **ranks, char *err,
                                      size_t errlen) {
  if (n < 1 || n > CUDA_COMM_MAX)
    return fail_msg(err, errlen, "--tensor-parallel-size %d: 1 to %d ranks on CUDA", n,
                    CUDA_COMM_MAX);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0) {
    cudaGetLastError();
    return fail_msg(err, errlen, "--device cuda: no CUDA device (%d ranks asked)", n);
  }
  int own = n <= ndev, one = n == 1 || ndev == 1;
  if (kind == CUDA_COMM_AUTO) kind = own && n > 1 ? CUDA_COMM_NCCL : CUDA_COMM_LOCAL;
#if !DS_NCCL
  if (kind == CUDA_COMM_NCCL)
    return fail_msg(err, errlen,
                    "--tensor-parallel-size %d over GPUs needs NCCL, and this build has none (no "
                    "nccl.h in the CUDA tree it was built with)",
                    n);
#endif
  if (kind == CUDA_COMM_NCCL && !own)
    return fail_msg(err, errlen, "--tensor-parallel-size %d: NCCL needs a GPU per rank (%d found)",
                    n, ndev);
  if (kind == CUDA_COMM_LOCAL && !one)
    return fail_msg(err, errlen,
                    "--tensor-parallel-size %d over %d GPUs: some ranks would share a GPU and "
                    "others not (NCCL needs a GPU per rank)",
                    n, ndev);
  cuda_comm *m = new (std::nothrow) cuda_comm();
  if (!m) return fail_msg(err, errlen, "out of memory");
  m->n = n;
  m->kind = kind;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  int prev = 0;
  cudaGetDevice(&prev);
  int r = 0, rc = 0;
  for (; r < n; r++) {
    m->dev[r] = r % ndev;
    if (!(ranks[r] = backend_cuda_create_test(m->dev[r], opt, t, err, errlen))) break;
    if (cudaSetDevice(m->dev[r]) != cudaSuccess ||
        cudaEventCreateWithFlags(&m->ev_in[r], cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&m->ev_out[r], cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      fail_msg(err, errlen, "cannot create the events of rank %d of %d", r, n);
      ranks[r]->destroy(ranks[r]);
      break;
    }
  }
  if (r < n) {
    rc = -1;
  } else if (kind == CUDA_COMM_NCCL) {
    /* NVLink multicast (NVLS) stays off: it reserves a large part of every GPU's memory for
     * its buffers, which the memory plan does not count; a value the user set is kept.
     * ncclConfig_t has no field for it, so this is the one environment write */
#if DS_NCCL
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclResult_t e = ncclCommInitAll(m->nccl, n, m->dev);
    if (e != ncclSuccess) {
      if (err && errlen)
        snprintf(err, errlen, "NCCL: cannot make the communicator of %d ranks: %s", n,
                 ncclGetErrorString(e));
      rc = -1;
    } else {
      m->nccl_up = 1;
    }
#endif
  }
  cudaSetDevice(prev);
  if (rc) {
    while (r-- > 0) ranks[r]->destroy(ranks[r]);
    comm_free(m);
    return -1;
  }
  m->refs.store(n);
  for (r = 0; r < n; r++) {
    cuda_ctx *c = cuda_ctx_of(ranks[r]);
    c->comm = m;
    c->comm_rank = r;
    ranks[r]->all_reduce_sum = cu_all_reduce_sum;
    ranks[r]->all_gather = cu_all_gather;
  }
  return n;
}
