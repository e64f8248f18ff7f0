// Private: NPU memory handed to an "acl" daemon by ACL IPC, as the Python client's device_memory
// (client/llm_datadist/_cache_ops.py): an IPC key only the daemon's pid (SO_PEERCRED of the attach connection) may
// import; while the daemon imports it, the memory's first 16 bytes hold this connection's proof of possession
// (server/datadist_ascend/proof.py: HMAC-SHA256 under the capability), restored before this returns. The ACL
// runtime is the process's own (dlsym; else libascendcl.so from $ASCEND_HOME_PATH/lib64): no link dependency.
#ifndef DATADIST_CPP_NPU_H_
#define DATADIST_CPP_NPU_H_

#include <cstdint>
#include <string>
#include <vector>

#include "attach.h"

namespace datadist_cpp {

// A range of this process's NPU memory exported by IPC key: one key per range, shared by every hand-over of it.
struct ExportRange {
  int32_t device = -1;
  uint64_t address = 0U;
  uint64_t length = 0U;
  bool operator<(const ExportRange &o) const {
    return device != o.device ? device < o.device : address != o.address ? address < o.address : length < o.length;
  }
};

// `device` is this process's logical NPU id; the daemon is told its physical id (logical ids are per process:
// ASCEND_RT_VISIBLE_DEVICES, container device mounts), as CANN's LLM-DataDist converts with
// aclrtGetPhyDevIdByLogicDevId (hixl rank_table_generator_v1.cc). On success *held is the range whose key the
// daemon now imports: the caller gives it back (ReleaseExports) once the daemon no longer imports it.
Status HandOverDeviceMemory(AttachClient &attach, uint64_t address, uint64_t length, int32_t device,
                            const char *func, uint64_t *memory_id, ExportRange *held);
// One user of each range goes (the daemon acknowledged that the cache holding it is gone, the engine's Finalize,
// the attach connection's end): a key whose last user went is closed as the exporter (aclrtIpcMemClose) --
// importer first, exporter second. A close that fails is logged once, never returned.
void ReleaseExports(const std::vector<ExportRange> &ranges);

// The physical id of this process's logical NPU `logical`.
Status PhysicalNpu(int32_t logical, const char *func, int32_t *physical);
// This process's logical id of physical NPU `physical` (LLM_PARAM_INVALID when this process does not see it).
Status LogicalNpu(int32_t physical, const char *func, int32_t *logical);
// This process's pid as the NPU driver knows it (aclrtDeviceGetBareTgid); 0 without a runtime.
int32_t BareTgid();
// This process's address of an NPU pool the daemon exported for it on physical NPU `physical`, imported on this
// process's logical id of it (*device); the caller's thread keeps its own device.
Status ImportDevicePool(const std::string &key, int32_t physical, const char *func, uint64_t *addr, int32_t *device);
// aclrtIpcMemClose of an imported pool (logical NPU `device`).
void CloseDevicePool(const std::string &key, int32_t device);
// ge.exec.deviceId ("0", or "0;1") with each logical id replaced by its physical id.
Status PhysicalNpus(const std::string &logical_ids, const char *func, std::string *physical_ids);

}  // namespace datadist_cpp

#endif  // DATADIST_CPP_NPU_H_
