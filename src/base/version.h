/* version — deltaserve's version, defined here only: `deltaserve --version` prints it. */
#ifndef DS_VERSION_H
#define DS_VERSION_H

#define VERSION_NUMBER "0.1"

/* "0.1 (git 0123456789ab)" when the build knew its commit (the Makefile passes
 * -DDS_GIT_COMMIT from `git rev-parse` of this tree), "0.1" otherwise (a tarball).
 * Static storage; never NULL. */
const char *version_string(void);

#endif
