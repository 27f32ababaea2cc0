/* backend_create — picks a backend by name: "cpu", "cuda", or "auto" (CUDA when this build
 * has it and a GPU is present, else the CPU). */
#ifndef DS_BACKEND_CREATE_H
#define DS_BACKEND_CREATE_H
#include <stddef.h>

#include "backend/backend.h"

/* Returns the backend opt describes, or NULL with one line in err ("cuda" in a build without
 * CUDA, no GPU, unknown name). */
backend *backend_create(const backend_options *opt, char *err, size_t errlen);

/* The N = opt->tensor_parallel_size ranks of a tensor-parallel model (0 or 1: one rank, the
 * backend backend_create makes) into ranks[0..N-1]: each a backend of its own, all joined by one
 * communicator (backend.h all_reduce_sum); on the CPU each rank runs on opt->n_threads / N
 * threads (all cores when 0), at least one. Returns N, or -1 with one line in err (nothing left
 * allocated): a backend cannot be made, N > max_ranks, or N > 1 on CUDA (its communicator
 * exists, backend/cuda/cuda_comm.h; the rest of the path not yet: docs/tensor-parallel.md). The
 * caller destroys every rank. */
int backend_create_ranks(const backend_options *opt, backend **ranks, int max_ranks, char *err,
                         size_t errlen);

#endif
