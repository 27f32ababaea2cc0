/* backend_create — picks a backend by name: "cpu", "cuda", or "auto" (CUDA when this build
 * has it and a GPU is present, else the CPU). */
#ifndef DS_BACKEND_CREATE_H
#define DS_BACKEND_CREATE_H
#include <stddef.h>

#include "backend/backend.h"

/* Returns the backend opt describes, or NULL with one line in err ("cuda" in a build without
 * CUDA, no GPU, unknown name). */
backend *backend_create(const backend_options *opt, char *err, size_t errlen);

#endif
