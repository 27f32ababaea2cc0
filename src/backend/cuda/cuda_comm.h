/* cuda_comm — the CUDA backend's communicator between the ranks of a tensor-parallel model
 * (backend.h all_reduce_sum, all_gather; docs/tensor-parallel.md "CUDA"): N CUDA backends of one
 * process, rank r on device r % device_count, each driven by a thread of its own
 * (qwen35_tp_runner), all joined by one communicator of one of two kinds:
 *
 *   NCCL   every rank on a GPU of its own: ncclAllReduce (bf16, sum) and ncclAllGather (f32) on
 *          the rank's stream. The sum has the same bits on every rank, but its order is NCCL's
 *          (ring or tree, chosen by size), not the rank order backend.h asks for;
 *   local  every rank on ONE GPU (tensor parallelism tested on a one-GPU machine): a kernel on
 *          each rank's stream reads every rank's buffer (one device: one address space) and
 *          sums its 1/N of the elements in the fixed order rank 0 + 1 + ... + N-1 in fp32,
 *          rounded once to bf16, written to every rank's buffer: the same bits on every rank,
 *          whatever the timing, reproducible. The all-gather: each rank copies every rank's
 *          buffer into its own output.
 *
 * How the ranks' streams meet (local): as backend/comm.c's ranks do, with two host barriers per
 * collective, but the barriers order only the issuing, never wait for the device: each rank
 * records an event after its input, posts its buffers, barrier; makes its stream wait for
 * every other rank's event, launches its part (its slice of the sum, its copies), records a
 * second event, barrier; makes its stream wait for every other rank's second event (nobody
 * reads or overwrites a buffer another rank's part still touches). The barriers also make every
 * event's re-recording come after every wait on its previous recording.
 *
 * CUDA graphs: over NCCL a collective is one more op of the recorded decode step
 * (cuda_graph_rec_collective), captured and replayed with the step's kernels. NCCL asks that
 * the ranks capture a collective together and launch graphs of the same joint capture, so
 * each rank flushes such a step on its own thread (backend.h step_end) and the ranks agree
 * there, through a host barrier, to replay, capture or run the step directly (cuda_graph.cu
 * flush_ranks). The local kind synchronises the ranks' threads inside the collective, which a
 * replayed graph cannot: there the collective ends the recording (cuda_graph_stop), the ops
 * recorded before it run launch by launch and the rest of the step as issued.
 * Includable from C. */
#ifndef DS_CUDA_COMM_H
#define DS_CUDA_COMM_H
#include <stddef.h>

#include "backend/backend.h"
#include "backend/cuda/backend_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_COMM_MAX 8 /* ranks at most */

typedef enum {
  CUDA_COMM_AUTO = 0,  /* NCCL when each rank has a device of its own, local when all share one */
  CUDA_COMM_NCCL = 1,  /* NCCL (every rank on its own device; one rank: the wiring alone) */
  CUDA_COMM_LOCAL = 2, /* the device-local reduction (every rank on one device) */
} cuda_comm_kind;

/* The n ranks (1 <= n <= CUDA_COMM_MAX) into ranks[0..n-1]: backend_cuda_create_test(r %
 * device_count, opt, t) each, joined by a communicator of `kind` (their all_reduce_sum).
 * Returns n, or -1 with one line in err (nothing left allocated): no device, a rank cannot be
 * made, NCCL over ranks that share a device, the local kind over ranks on several devices, an
 * NCCL failure. The caller destroys every rank (the last one frees the communicator). Not yet
 * what backend_create_ranks gives users (docs/tensor-parallel.md says what is missing). */
int cuda_comm_create_ranks(int n, cuda_comm_kind kind, const backend_options *opt,
                           const backend_cuda_test *t, backend **ranks, char *err, size_t errlen);

/* "nccl" or "local": the kind of be's communicator; NULL when be is one rank alone. */
const char *cuda_comm_kind_name(backend *be);

#ifdef __cplusplus
}
#endif

#endif
