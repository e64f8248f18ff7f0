// Private: NPU memory handed to an "acl" daemon by ACL IPC, as the Python client's device_memory
// (client/llm_datadist/_cache_ops.py): an IPC key only the daemon's pid (SO_PEERCRED of the attach connection) may
// import; while the daemon imports it, the memory's first 16 bytes hold this connection's proof of possession
// (server/datadist_ascend/proof.py: HMAC-SHA256 under the capability), restored before this returns. The ACL
// runtime is the process's own (dlsym; else libascendcl.so from $ASCEND_HOME_PATH/lib64): no link dependency.
#ifndef DATADIST_CPP_NPU_H_
#define DATADIST_CPP_NPU_H_

#include <cstdint>

#include "attach.h"

namespace datadist_cpp {

Status HandOverDeviceMemory(AttachClient &attach, uint64_t address, uint64_t length, int32_t device,
                            const char *func, uint64_t *memory_id);

}  // namespace datadist_cpp

#endif  // DATADIST_CPP_NPU_H_
