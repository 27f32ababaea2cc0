/* version — see version.h. */
#include "base/version.h"

#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT ""
#endif

const char *version_string(void) {
  return DS_GIT_COMMIT[0] ? VERSION_NUMBER " (git " DS_GIT_COMMIT ")" : VERSION_NUMBER;
}
