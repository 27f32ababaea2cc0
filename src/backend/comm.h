/* comm — an in-process communicator: the collectives that tensor parallelism needs between
 * the ranks of one model (docs/tensor-parallel.md), for ranks that are threads of one process
 * sharing host memory (the CPU backend's ranks).
 *
 *   rank 0 ─┐                 ┌─ rank 0
 *   rank 1 ─┼─ all_reduce_sum ┼─ rank 1     every rank ends with x_0 + x_1 + ... + x_{N-1},
 *   ...     │  (rank order)   │  ...        added in rank order, the same bits on every rank
 *   rank N-1┘                 └─ rank N-1
 *
 * Every rank calls the same collectives in the same order (SPMD, as NCCL's ranks do); a call
 * returns on a rank once every rank has made it and the result is in place. Sums are taken in
 * the FIXED order rank 0, 1, ..., N-1 for every element, whichever thread computes which
 * elements, so the result never depends on thread timing: a run is reproducible bit for bit.
 * A device backend would put NCCL's communicator behind the same calls (backend.h
 * all_reduce_sum). */
#ifndef DS_COMM_H
#define DS_COMM_H
#include <stddef.h>

typedef struct comm comm;

/* A communicator of n_ranks >= 1 ranks, holding one reference. Returns NULL when out of memory.
 * Each rank's user takes its own reference (comm_ref) and drops it (comm_unref): the last
 * comm_unref frees it. */
comm *comm_create(int n_ranks);
comm *comm_ref(comm *c);
void comm_unref(comm *c); /* NULL is a no-op */
int comm_size(const comm *c);

/* Rank `rank`'s part of a sum over the ranks: x [n] floats on every rank; afterwards every
 * rank's x[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{N-1}[i]. Every rank passes the same n.
 * Each rank adds a contiguous 1/N of the elements (its own threads' work), so the work is
 * shared and the order of each element's sum stays the rank order. One rank: returns at once. */
void comm_all_reduce_sum(comm *c, int rank, float *x, size_t n);

/* Rank `rank`'s part of a gather: src [n] floats on every rank; afterwards every rank's dst
 * [N, n] holds rank r's src in row r. dst may not overlap src. */
void comm_all_gather(comm *c, int rank, const float *src, size_t n, float *dst);

/* Returns on every rank once every rank has called it. */
void comm_barrier(comm *c);

#endif
