/* cuda_ktrace — where a replayed decode step's time goes, kernel by kernel, inside the real
 * pipelined run (an instrument build: `make CUDA=1 cuda-ktrace`, -DDS_KTRACE; without it every
 * function is a no-op). The report goes to stderr at the backend's destroy, each line prefixed
 * "ktrace| " (scripts/device/ab.sh DS_AB_KTRACE=1 collects them).
 *
 * ncu times each kernel alone and cold, and its sums miss what a programmatic-launch step
 * actually pays at each kernel boundary (the tail of one kernel, the release of the next, its
 * ramp). Here block (0,0,0) of every kernel of ours writes the GPU's global timer into a ring
 * right after its griddepcontrol.wait returns, i.e. the moment its predecessor has finished
 * and flushed (cuda_common.cuh, ktrace_stamp). The interval from one stamp to the next is then
 * the cost of that kernel in the step as it runs: work, tail and the boundary after it.
 *
 * Bookkeeping on the host: while a decode step is captured, each launch of ours appends the
 * name it was checked under (cuda_check_launch's `what`), in launch order, which is the order
 * of the stamps; at instantiation the list is kept for that graph. Before every replay (the
 * stream idle: the previous step's results have been read) the ring is read back; when its
 * count equals the previous replay's kernel count the intervals are added to that graph's
 * sums (other counts: a direct run in between, a kernel without pdl_enter; counted, dropped)
 * and the ring is reset. The last kernel of a step has no following stamp and is not timed.
 * The global timer's resolution may be coarse (~1 µs on some parts); the means over hundreds
 * of replays are what the report gives.
 *
 * Each kernel file has its own copy of the ring pointer (separate compilation), bound here
 * through the CUDA_KTRACE_TU function every file defines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

#ifdef DS_KTRACE

extern "C" {
void cuda_backend_ktrace_bind(void *), cuda_attn_ktrace_bind(void *), cuda_elem_ktrace_bind(void *),
    cuda_flash_ktrace_bind(void *), cuda_gdn_ktrace_bind(void *), cuda_moe_ktrace_bind(void *),
    cuda_sgemm_ktrace_bind(void *), cuda_greedy_ktrace_bind(void *),
    cuda_sample_ktrace_bind(void *), cuda_gemm_ktrace_bind(void *), cuda_fp8_ktrace_bind(void *);
}

struct ktrace_graph {
  std::vector<const char *> names; /* launch order */
  std::vector<double> sum_us;      /* per kernel: summed intervals to the next stamp */
  double span_us = 0;              /* first stamp to last, summed */
  long replays = 0, dropped = 0;
};

struct cuda_ktrace {
  unsigned long long *ring = nullptr; /* device: count, stamps */
  std::vector<const char *> capturing;
  std::map<const void *, ktrace_graph> graphs;
  const void *prev = nullptr; /* the graph launched last */
  std::vector<unsigned long long> host;
};

int cuda_ktrace_init(cuda_ctx *c) {
  cuda_ktrace *k = new cuda_ktrace();
  size_t bytes = (KTRACE_CAP + 1) * sizeof(unsigned long long);
  if (cudaMalloc(&k->ring, bytes) != cudaSuccess || cudaMemset(k->ring, 0, bytes) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(k->ring);
    delete k;
    return -1;
  }
  void (*bind[])(void *) = {
      cuda_backend_ktrace_bind, cuda_attn_ktrace_bind,   cuda_elem_ktrace_bind,
      cuda_flash_ktrace_bind,   cuda_gdn_ktrace_bind,    cuda_moe_ktrace_bind,
      cuda_sgemm_ktrace_bind,   cuda_greedy_ktrace_bind, cuda_sample_ktrace_bind,
      cuda_gemm_ktrace_bind,    cuda_fp8_ktrace_bind};
  for (auto f : bind) f(k->ring);
  k->host.resize(KTRACE_CAP + 1);
  c->kt = k;
  fprintf(stderr, "cuda: kernel-release trace on (a -DDS_KTRACE build)\n");
  return 0;
}

void cuda_ktrace_capture_begin(cuda_ctx *c) {
  if (c->kt) c->kt->capturing.clear();
}

void cuda_ktrace_launch(cuda_ctx *c, const char *what) {
  if (c->kt) c->kt->capturing.push_back(what);
}

void cuda_ktrace_capture_end(cuda_ctx *c, const void *exec) {
  cuda_ktrace *k = c->kt;
  if (!k) return;
  ktrace_graph &g = k->graphs[exec];
  g = ktrace_graph();
  g.names = k->capturing;
  g.sum_us.assign(g.names.size(), 0.0);
  cuda_ktrace_replay(c, exec); /* the capture launches it right away */
}

void cuda_ktrace_replay(cuda_ctx *c, const void *exec) {
  cuda_ktrace *k = c->kt;
  if (!k) return;
  if (cudaStreamSynchronize(c->st) != cudaSuccess ||
      cudaMemcpy(k->host.data(), k->ring, k->host.size() * sizeof(unsigned long long),
                 cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  auto it = k->prev ? k->graphs.find(k->prev) : k->graphs.end();
  if (it != k->graphs.end()) {
    ktrace_graph &g = it->second;
    unsigned long long n = k->host[0];
    const unsigned long long *t = k->host.data() + 1;
    if (n == g.names.size() && n >= 2) {
      for (size_t i = 0; i + 1 < n; i++) g.sum_us[i] += (double)(t[i + 1] - t[i]) * 1e-3;
      g.span_us += (double)(t[n - 1] - t[0]) * 1e-3;
      g.replays++;
    } else {
      g.dropped++;
    }
  }
  unsigned long long zero = 0;
  cudaMemcpy(k->ring, &zero, sizeof zero, cudaMemcpyHostToDevice);
  k->prev = exec;
}

/* One graph's report: each name's launches per step and µs per step, largest first, then the
 * kernels in launch order with their mean intervals. */
static void ktrace_report_graph(FILE *f, const ktrace_graph &g, int idx) {
  double r = (double)g.replays;
  fprintf(
      f,
      "ktrace| graph %d: %zu kernels, %ld replays timed (%ld dropped), first to last stamp %.1f "
      "us\n",
      idx, g.names.size(), g.replays, g.dropped, g.span_us / r);
  std::map<std::string, std::pair<int, double>> by;
  for (size_t i = 0; i + 1 < g.names.size(); i++) {
    auto &e = by[g.names[i]];
    e.first++;
    e.second += g.sum_us[i] / r;
  }
  std::vector<std::pair<double, std::string>> order;
  for (auto &e : by) order.push_back({e.second.second, e.first});
  std::sort(order.rbegin(), order.rend());
  for (auto &o : order) {
    auto &e = by[o.second];
    fprintf(f, "ktrace|   %-32s %4d per step %9.1f us per step %7.2f us each\n", o.second.c_str(),
            e.first, e.second, e.second / e.first);
  }
  for (size_t i = 0; i + 1 < g.names.size(); i++)
    fprintf(f, "ktrace|   #%zu %s %.2f\n", i, g.names[i], g.sum_us[i] / r);
}

void cuda_ktrace_release(cuda_ctx *c) {
  cuda_ktrace *k = c->kt;
  if (!k) return;
  int idx = 0;
  for (auto &e : k->graphs) {
    if (e.second.replays < 5) continue;
    ktrace_report_graph(stderr, e.second, idx++);
  }
  cudaFree(k->ring);
  delete k;
  c->kt = NULL;
}

#else

int cuda_ktrace_init(cuda_ctx *c) {
  c->kt = NULL;
  return 0;
}
void cuda_ktrace_capture_begin(cuda_ctx *) {}
void cuda_ktrace_launch(cuda_ctx *, const char *) {}
void cuda_ktrace_capture_end(cuda_ctx *, const void *) {}
void cuda_ktrace_replay(cuda_ctx *, const void *) {}
void cuda_ktrace_release(cuda_ctx *) {}

#endif
