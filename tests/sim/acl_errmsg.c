/* SIMULATED aclGetRecentErrMsg, compiled into the simulated libascendcl.so beside ascendcl.c (tests/sim/__init__.py):
 * written by datadist, not Huawei's code. The simulation keeps no error messages, so it answers NULL ("no
 * message"), as the real call does when the thread's last call succeeded. */
#include <stddef.h>

const char *aclGetRecentErrMsg(void) { return NULL; }
