/* SIMULATED acl/acl.h -- written by datadist for tests, not Huawei's header. It declares, with the prototypes
 * and values of CANN's public acl headers, the part of the ACL runtime the simulated libascendcl.so
 * (tests/sim/ascendcl.c, acl_errmsg.c) exports, so that C++ code written for an NPU -- CANN's own LLM-DataDist
 * samples -- builds and runs on a host without CANN. tests.sim.build() installs it as
 * <root>/include/acl/acl.h beside <root>/lib64/, as in $ASCEND_HOME_PATH. */
#ifndef DATADIST_SIM_ACL_ACL_H_
#define DATADIST_SIM_ACL_ACL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int aclError;
typedef void *aclrtStream;

static const int ACL_SUCCESS = 0;
static const int ACL_ERROR_NONE = 0;
static const int ACL_ERROR_INVALID_PARAM = 100000;
static const int ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;

typedef enum aclrtMemMallocPolicy {
  ACL_MEM_MALLOC_HUGE_FIRST = 0,
  ACL_MEM_MALLOC_HUGE_ONLY = 1,
  ACL_MEM_MALLOC_NORMAL_ONLY = 2,
} aclrtMemMallocPolicy;

typedef enum aclrtMemcpyKind {
  ACL_MEMCPY_HOST_TO_HOST = 0,
  ACL_MEMCPY_HOST_TO_DEVICE = 1,
  ACL_MEMCPY_DEVICE_TO_HOST = 2,
  ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
} aclrtMemcpyKind;

aclError aclInit(const char *configPath);
aclError aclFinalize(void);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream);
aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);
/* the message of the last failed call of this thread, or NULL */
const char *aclGetRecentErrMsg(void);

#ifdef __cplusplus
}
#endif

#endif /* DATADIST_SIM_ACL_ACL_H_ */
