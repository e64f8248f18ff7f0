#include "npu.h"

#include <dlfcn.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace datadist_cpp {
namespace {
constexpr size_t kProofLen = 16U;
constexpr size_t kIpcKeyLen = 65U;
constexpr int kHostToDevice = 1;
constexpr int kDeviceToHost = 2;
const char kLabel[] = "datadist npu memory possession v1";  // + its NUL, as proof.py's label

struct Acl {
  int (*set_device)(int32_t) = nullptr;
  int (*export_key)(void *, size_t, char *, size_t, uint64_t) = nullptr;
  int (*set_import_pid)(const char *, int32_t *, size_t) = nullptr;
  int (*memcpy)(void *, size_t, const void *, size_t, int) = nullptr;
  int (*physical_id)(int32_t, int32_t *) = nullptr;
  int (*device_count)(uint32_t *) = nullptr;
  int (*get_device)(int32_t *) = nullptr;
  int (*import_key)(void **, const char *, uint64_t) = nullptr;
  int (*ipc_close)(const char *) = nullptr;
  int (*bare_tgid)(int32_t *) = nullptr;
  bool ok() const {
    return set_device && export_key && set_import_pid && memcpy && physical_id && device_count && get_device &&
           import_key && ipc_close && bare_tgid;
  }
};

template <typename F>
void Resolve(void *lib, const char *name, F *fn) {
  void *sym = dlsym(lib, name);
  *fn = reinterpret_cast<F>(sym);
}

const Acl &Runtime() {
  static Acl acl;
  static std::once_flag once;
  std::call_once(once, [] {
    void *lib = RTLD_DEFAULT;
    if (dlsym(lib, "aclrtIpcMemGetExportKey") == nullptr) {
      const char *home = std::getenv("ASCEND_HOME_PATH");
      const std::string path = home != nullptr ? std::string(home) + "/lib64/libascendcl.so" : "libascendcl.so";
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (lib == nullptr) return;
    }
    Resolve(lib, "aclrtSetDevice", &acl.set_device);
    Resolve(lib, "aclrtIpcMemGetExportKey", &acl.export_key);
    Resolve(lib, "aclrtIpcMemSetImportPid", &acl.set_import_pid);
    Resolve(lib, "aclrtMemcpy", &acl.memcpy);
    Resolve(lib, "aclrtGetPhyDevIdByLogicDevId", &acl.physical_id);
    Resolve(lib, "aclrtGetDeviceCount", &acl.device_count);
    Resolve(lib, "aclrtGetDevice", &acl.get_device);
    Resolve(lib, "aclrtIpcMemImportByKey", &acl.import_key);
    Resolve(lib, "aclrtIpcMemClose", &acl.ipc_close);
    Resolve(lib, "aclrtDeviceGetBareTgid", &acl.bare_tgid);
  });
  return acl;
}

// `device` current in the calling thread while it lives (aclrtSetDevice only when it is not: each call takes a
// reference on the device's primary context), the caller's device current again after: a worker's thread may drive
// other NPUs.
class OnDevice {
 public:
  OnDevice(const Acl &acl, int32_t device) : acl_(acl), device_(device) {
    if (acl_.get_device(&before_) != 0) before_ = -1;
    err_ = before_ == device_ ? 0 : acl_.set_device(device_);
  }
  ~OnDevice() {
    if (before_ >= 0 && before_ != device_) (void)acl_.set_device(before_);
  }
  int err() const { return err_; }

 private:
  const Acl &acl_;
  int32_t device_;
  int32_t before_ = -1;
  int err_ = 0;
};

// The process's export keys by range, with their users and the pids already allowed to import them.
struct Export {
  std::string key;
  int users = 0;
  std::set<int32_t> allowed;
};
std::mutex g_exports_mu;
std::map<ExportRange, Export> g_exports;
std::atomic<bool> g_close_warned{false};

// aclrtIpcMemClose of an export key on logical NPU `device` (the caller keeps its own device): logged once if it
// fails (a runtime that refuses one close refuses them all)
void CloseExport(const Acl &acl, int32_t device, const std::string &key) {
  const OnDevice on_device(acl, device);
  int err = on_device.err();
  if (err == 0) err = acl.ipc_close(key.c_str());
  if (err != 0 && !g_close_warned.exchange(true)) {
    Log(LogLevel::kWarning, "closing an export key of this process's NPU memory (aclrtIpcMemClose): aclError " +
                                std::to_string(err));
  }
}

// The key of `range` with `pid` allowed to import it (exported now if no hand-over holds one), one more user; the
// caller holds the range's device current. 0 or the aclError.
int AcquireExport(const Acl &acl, const ExportRange &range, int32_t pid, std::string *key) {
  std::lock_guard<std::mutex> lock(g_exports_mu);
  auto it = g_exports.find(range);
  const bool fresh = it == g_exports.end();
  Export exp;
  if (fresh) {
    char buf[kIpcKeyLen] = {0};
    const int err = acl.export_key(reinterpret_cast<void *>(range.address), range.length, buf, sizeof(buf), 0U);
    if (err != 0) return err;
    exp.key = buf;
  } else {
    exp = it->second;
  }
  if (exp.allowed.count(pid) == 0U) {
    int32_t allowed = pid;
    const int err = acl.set_import_pid(exp.key.c_str(), &allowed, 1U);
    if (err != 0) {
      if (fresh) (void)acl.ipc_close(exp.key.c_str());
      return err;
    }
    exp.allowed.insert(pid);
  }
  ++exp.users;
  *key = exp.key;
  g_exports[range] = exp;
  return 0;
}

Status NoRuntime(const char *func) {
  return Fail(func, llm_datadist::LLM_FEATURE_NOT_ENABLED,
              "the daemon keeps DEVICE caches in NPU memory (memory backend acl), and this process has no ACL "
              "runtime (libascendcl.so) to export it");
}
}  // namespace

Status PhysicalNpu(int32_t logical, const char *func, int32_t *physical) {
  const Acl &acl = Runtime();
  if (!acl.ok()) return NoRuntime(func);
  const int err = acl.physical_id(logical, physical);
  if (err != 0) {
    return Fail(func, llm_datadist::LLM_PARAM_INVALID, "NPU " + std::to_string(logical) +
                                                           " is not an NPU of this process: aclError " +
                                                           std::to_string(err));
  }
  return llm_datadist::LLM_SUCCESS;
}

Status LogicalNpu(int32_t physical, const char *func, int32_t *logical) {
  const Acl &acl = Runtime();
  if (!acl.ok()) return NoRuntime(func);
  uint32_t count = 0U;
  if (acl.device_count(&count) == 0) {
    for (uint32_t d = 0U; d < count; ++d) {
      int32_t phy = -1;
      if (acl.physical_id(static_cast<int32_t>(d), &phy) == 0 && phy == physical) {
        *logical = static_cast<int32_t>(d);
        return llm_datadist::LLM_SUCCESS;
      }
    }
  }
  return Fail(func, llm_datadist::LLM_PARAM_INVALID, "datadistd names NPU " + std::to_string(physical) +
                                                         " (physical id), which this process does not see "
                                                         "(ASCEND_RT_VISIBLE_DEVICES)");
}

int32_t BareTgid() {
  const Acl &acl = Runtime();
  int32_t pid = 0;
  if (!acl.ok() || acl.bare_tgid(&pid) != 0) return 0;
  return pid;
}

Status ImportDevicePool(const std::string &key, int32_t physical, const char *func, uint64_t *addr,
                        int32_t *device) {
  const Acl &acl = Runtime();
  if (!acl.ok()) return NoRuntime(func);
  Status st = LogicalNpu(physical, func, device);
  if (st != llm_datadist::LLM_SUCCESS) return st;
  const OnDevice on_device(acl, *device);
  void *ptr = nullptr;
  int err = on_device.err();
  if (err == 0) err = acl.import_key(&ptr, key.c_str(), 0U);
  if (err != 0) {
    return Fail(func, llm_datadist::LLM_FAILED, "importing the NPU pool by IPC key failed: aclError " +
                                                    std::to_string(err));
  }
  *addr = reinterpret_cast<uint64_t>(ptr);
  return llm_datadist::LLM_SUCCESS;
}

void CloseDevicePool(const std::string &key, int32_t device) {
  const Acl &acl = Runtime();
  if (!acl.ok()) return;
  const OnDevice on_device(acl, device);
  if (on_device.err() == 0) (void)acl.ipc_close(key.c_str());
}

Status PhysicalNpus(const std::string &logical_ids, const char *func, std::string *physical_ids) {
  std::string out;
  size_t start = 0U;
  while (start <= logical_ids.size()) {
    const size_t end = logical_ids.find(';', start);
    const std::string id = logical_ids.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos || id.size() > 9U) {
      *physical_ids = logical_ids;  // the daemon refuses it, naming the option
      return llm_datadist::LLM_SUCCESS;
    }
    int32_t phy = 0;
    const Status st = PhysicalNpu(std::stoi(id), func, &phy);
    if (st != llm_datadist::LLM_SUCCESS) return st;
    out += (out.empty() ? "" : ";") + std::to_string(phy);
    if (end == std::string::npos) break;
    start = end + 1U;
  }
  *physical_ids = out;
  return llm_datadist::LLM_SUCCESS;
}


void ReleaseExports(const std::vector<ExportRange> &ranges) {
  std::vector<std::pair<int32_t, std::string>> closing;
  {
    std::lock_guard<std::mutex> lock(g_exports_mu);
    for (const ExportRange &r : ranges) {
      auto it = g_exports.find(r);
      if (it == g_exports.end()) continue;
      if (--it->second.users <= 0) {
        closing.emplace_back(r.device, it->second.key);
        g_exports.erase(it);
      }
    }
  }
  if (closing.empty()) return;
  const Acl &acl = Runtime();
  for (const auto &c : closing) CloseExport(acl, c.first, c.second);
}

Status HandOverDeviceMemory(AttachClient &attach, uint64_t address, uint64_t length, int32_t device,
                            const char *func, uint64_t *memory_id, ExportRange *held) {
  const Acl &acl = Runtime();
  if (!acl.ok()) return NoRuntime(func);
  if (length < kProofLen) {
    return Fail(func, llm_datadist::LLM_PARAM_INVALID, "NPU memory handed to the daemon must be at least 16 bytes");
  }
  if (attach.daemon_tgid() <= 0) return Fail(func, llm_datadist::LLM_FAILED, "the daemon's pid is unknown");
  void *ptr = reinterpret_cast<void *>(address);
  const OnDevice on_device(acl, device);
  int err = on_device.err();
  std::string key;
  ExportRange range;
  range.device = device;
  range.address = address;
  range.length = length;
  if (err == 0) err = AcquireExport(acl, range, attach.daemon_tgid(), &key);
  if (err != 0) {
    return Fail(func, llm_datadist::LLM_PARAM_INVALID, "exporting the NPU memory by IPC failed: aclError " +
                                                           std::to_string(err));
  }
  std::string message(kLabel, sizeof(kLabel));  // with its NUL
  message += key;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0U;
  const std::string &cap = attach.capability();
  if (HMAC(EVP_sha256(), cap.data(), static_cast<int>(cap.size()), reinterpret_cast<const unsigned char *>(message.data()),
           message.size(), digest, &digest_len) == nullptr) {
    ReleaseExports({range});
    return Fail(func, llm_datadist::LLM_FAILED, "HMAC-SHA256 failed");
  }
  unsigned char saved[kProofLen];
  err = acl.memcpy(saved, kProofLen, ptr, kProofLen, kDeviceToHost);
  if (err == 0) err = acl.memcpy(ptr, kProofLen, digest, kProofLen, kHostToDevice);
  if (err != 0) {
    ReleaseExports({range});
    return Fail(func, llm_datadist::LLM_PARAM_INVALID, "aclrtMemcpy of the NPU memory failed: aclError " +
                                                           std::to_string(err));
  }
  int32_t physical = -1;
  Status st = PhysicalNpu(device, func, &physical);
  if (st == llm_datadist::LLM_SUCCESS) st = attach.ImportDeviceMemory(key, physical, length, func, memory_id);
  if (st == llm_datadist::LLM_SUCCESS) {
    *held = range;  // the daemon imports it: the user is the caller's (or nobody's: never closed under it)
  } else {
    ReleaseExports({range});  // the daemon did not import it
  }
  err = acl.memcpy(ptr, kProofLen, saved, kProofLen, kHostToDevice);
  if (err != 0) {
    return Fail(func, llm_datadist::LLM_FAILED, "could not restore the first 16 bytes of the NPU memory: aclError " +
                                                    std::to_string(err));
  }
  return st;
}

}  // namespace datadist_cpp
