#include "backend/backend_create.h"

#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "base/log.h"
#ifdef DS_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

backend *backend_create(const backend_options *opt, char *err, size_t errlen) {
  const char *device = opt->device;
  if (!device || !strcmp(device, "auto")) {
    device = "cpu";
#ifdef DS_CUDA
    if (backend_cuda_available()) device = "cuda";
#endif
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
