/* backend_create — picks a backend by name: "cpu", "cuda", or "auto" (CUDA when this build
 * has it and a GPU is present, else the CPU). */
#ifndef DS_BACKEND_CREATE_H
#define DS_BACKEND_CREATE_H
#include <stddef.h>

#include "backend/backend.h"

/* Returns the backend, or NULL with one line in err ("cuda" in a build without CUDA, no GPU,
 * unknown name). n_threads applies to the CPU backend (0: all cores). */
backend *backend_create(const char *device, int n_threads, char *err, size_t errlen);

#endif
