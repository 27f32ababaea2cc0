/* file_read — a whole file into memory (model folder files: tokenizer.json, chat templates). */
#ifndef DS_FILE_READ_H
#define DS_FILE_READ_H
#include <stddef.h>

/* Reads all of path. Returns a malloc'd NUL-terminated buffer (caller frees; *len, if not NULL,
 * its length without the NUL), or NULL with errno set when it cannot be opened or read, or on
 * out of memory. */
char *file_read(const char *path, size_t *len);

#endif
