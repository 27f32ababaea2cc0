#include "backend/backend_create.h"

#include <string.h>
#include <unistd.h>

#include "backend/comm.h"
#include "backend/cpu/backend_cpu.h"
#include "base/log.h"
#ifdef DS_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

/* The device "auto" stands for in this build on this machine. */
static const char *device_of(const backend_options *opt) {
  const char *device = opt->device;
  if (!device || !strcmp(device, "auto")) {
    device = "cpu";
#ifdef DS_CUDA
    if (backend_cuda_available()) device = "cuda";
#endif
  }
  return device;
}

backend *backend_create(const backend_options *opt, char *err, size_t errlen) {
  const char *device = device_of(opt);
  if (opt->tensor_parallel_size > 1) {
    errf(err, errlen, "backend_create makes one rank: %d ranks are backend_create_ranks'",
         opt->tensor_parallel_size);
    return NULL;
  }
  if (!strcmp(device, "cpu")) {
    backend *be = backend_cpu_create_opt(opt);
    if (!be) errf(err, errlen, "cannot create the CPU backend (out of memory)");
    return be;
  }
  if (!strcmp(device, "cuda")) {
#ifdef DS_CUDA
    return backend_cuda_create(0, opt, err, errlen);
#else
    errf(err, errlen, "--device cuda: this build has no CUDA backend (build with make CUDA=1)");
    return NULL;
#endif
  }
  errf(err, errlen, "unknown --device '%s' (expected cpu, cuda or auto)", device);
  return NULL;
}

int backend_create_ranks(const backend_options *opt, backend **ranks, int max_ranks, char *err,
                         size_t errlen) {
  int n = opt->tensor_parallel_size > 1 ? opt->tensor_parallel_size : 1;
  if (n > max_ranks)
    return errf(err, errlen, "--tensor-parallel-size %d: at most %d ranks", n, max_ranks);
  if (n == 1) {
    backend_options one = *opt;
    one.tensor_parallel_size = 1;
    return (ranks[0] = backend_create(&one, err, errlen)) ? 1 : -1;
  }
  const char *device = device_of(opt);
  if (strcmp(device, "cpu"))
    return errf(err, errlen,
                "--tensor-parallel-size > 1 needs NCCL builds; not available on the %s backend "
                "yet (--device cpu runs it)",
                device);
  comm *cm = comm_create(n);
  if (!cm) return errf(err, errlen, "out of memory");
  backend_options ro = *opt;
  int total = opt->n_threads;
  if (total <= 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    total = c > 0 ? (int)c : 1;
  }
  ro.n_threads = total / n > 0 ? total / n : 1;
  int r = 0;
  for (; r < n; r++)
    if (!(ranks[r] = backend_cpu_create_rank(&ro, cm, r))) break;
  comm_unref(cm); /* each rank holds its own reference */
  if (r == n) return n;
  while (r-- > 0) ranks[r]->destroy(ranks[r]);
  return errf(err, errlen, "cannot create the CPU backend's ranks (out of memory)");
}
