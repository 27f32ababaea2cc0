/* backend_cpu — the reference backend: fp32 activations and math, weights converted exactly
 * from bf16/f16/f32 to fp32 at upload, a small pthread pool that splits work only over
 * independent outputs (every output element is one loop of fixed order, so results are
 * bit-identical whatever the batch composition or thread count). */
#ifndef DS_BACKEND_CPU_H
#define DS_BACKEND_CPU_H
#include "backend/backend.h"

/* Creates a CPU backend running ops on n_threads threads (the caller's included; <= 0 means
 * the number of online CPUs). Returns NULL when out of memory or when threads cannot start.
 * Destroy with be->destroy(be). */
backend *backend_cpu_create(int n_threads);
/* The same with the user's choices: opt->n_threads as above and opt->kv_dtype (the K/V pages'
 * type, backend.h "Paged K/V"); opt->device and opt->batch_invariant are not read (the CPU
 * backend always is batch invariant), nor opt->tensor_parallel_size (one rank alone; ranks are
 * backend_cpu_create_rank's). */
backend *backend_cpu_create_opt(const backend_options *opt);
/* backend_cpu_create_opt for rank `rank` of the tensor-parallel ranks joined by cm (it takes a
 * reference, dropped by destroy): its all_reduce_sum is cm's (backend/comm.h), so the ranks run
 * on threads of one process. opt->tensor_parallel_size is not read (cm's size is). */
typedef struct comm comm;
backend *backend_cpu_create_rank(const backend_options *opt, comm *cm, int rank);

#endif
