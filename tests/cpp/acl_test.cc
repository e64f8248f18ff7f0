// NPU memory from aclrtMalloc through two "acl" daemons (tests/cpp/test_cpp_acl.py, on the simulated runtime or a
// real one): each engine registers kDevice tensors (handed over by ACL IPC), the decoder pulls a batch and blocks
// and pushes blocks back; the bytes are checked with aclrtMemcpy (the host cannot load NPU memory).
//   acl_test <target A> <target B> <port>
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
int g_failed = 0;
constexpr uint32_t kTensors = 4U;
constexpr int64_t kRows = 8, kCols = 16;
constexpr size_t kBytes = kRows * kCols * sizeof(int32_t);

void Expect(const char *name, Status got, Status want) {
  std::printf(got == want ? "ok %s\n" : "FAIL %s: got 0x%X\n", name, got);
  if (got != want) ++g_failed;
}
void Check(const char *name, bool ok) {
  std::printf(ok ? "ok %s\n" : "FAIL %s\n", name);
  if (!ok) ++g_failed;
}

struct Npu {
  std::vector<void *> tensors;
  std::vector<uint64_t> addrs;
  int32_t device;
  Npu(int32_t dev, int32_t seed) : device(dev) {
    aclrtSetDevice(device);
    for (uint32_t t = 0; t < kTensors; ++t) {
      void *p = nullptr;
      if (aclrtMalloc(&p, kBytes, ACL_MEM_MALLOC_HUGE_ONLY) != ACL_SUCCESS) std::printf("FAIL aclrtMalloc\n");
      std::vector<int32_t> host(kRows * kCols);
      for (size_t i = 0; i < host.size(); ++i) host[i] = seed * 100000 + static_cast<int32_t>(t * 1000 + i);
      aclrtMemcpy(p, kBytes, host.data(), kBytes, ACL_MEMCPY_HOST_TO_DEVICE);
      tensors.push_back(p);
      addrs.push_back(reinterpret_cast<uint64_t>(p));
    }
  }
  ~Npu() {
    aclrtSetDevice(device);
    for (void *p : tensors) aclrtFree(p);
  }
  std::vector<int32_t> Row(uint32_t t, int64_t r) const {
    std::vector<int32_t> out(kCols, -1);
    aclrtSetDevice(device);  // a thread copies the memory of its current device only
    aclrtMemcpy(out.data(), kCols * sizeof(int32_t), static_cast<char *>(tensors[t]) + r * kCols * sizeof(int32_t),
                kCols * sizeof(int32_t), ACL_MEMCPY_DEVICE_TO_HOST);
    return out;
  }
};

// The export keys this process made and has not closed (the simulated runtime keeps each as
// $ASCEND_SIM_DIR/ipc-k<exporter pid>-...: tests/sim/ascendcl.c); -1 on a real runtime.
int OpenExportKeys() {
  const char *dir = std::getenv("ASCEND_SIM_DIR");
  DIR *d = dir != nullptr ? opendir(dir) : nullptr;
  if (d == nullptr) return -1;
  const std::string prefix = "ipc-k" + std::to_string(getpid()) + "-";
  int n = 0;
  for (dirent *e = readdir(d); e != nullptr; e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0 && name.find(".tmp") == std::string::npos) ++n;
  }
  closedir(d);
  return n;
}

// The keys this process closed (aclrtIpcMemClose lines of the simulated runtime's ledger).
int Closes() {
  const char *dir = std::getenv("ASCEND_SIM_DIR");
  std::ifstream in(std::string(dir != nullptr ? dir : "") + "/ledger");
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    int pid = 0;
    std::string call;
    words >> pid >> call;
    if (pid == getpid() && call == "aclrtIpcMemClose") ++n;
  }
  return n;
}

CacheDesc Desc() {
  CacheDesc d{};
  d.placement = CachePlacement::kDevice;
  d.num_tensors = kTensors;
  d.data_type = DT_INT32;
  d.shape = {kRows, kCols};
  return d;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  const std::string listen = std::string("127.0.0.1:") + argv[3];
  LlmDataDist prompt(1U, LlmRole::kPrompt), decoder(2U, LlmRole::kDecoder);
  std::map<AscendString, AscendString> po{{OPTION_DEVICE_ID, "0"}, {"datadist.daemon", argv[1]},
                                          {OPTION_LISTEN_IP_INFO, listen.c_str()}};
  std::map<AscendString, AscendString> dopt{{OPTION_DEVICE_ID, "1"}, {"datadist.daemon", argv[2]},
                                            {"llm.MemPoolConfig", "{\"memory_size\": 4194304}"}};
  Expect("prompt_initialize", prompt.Initialize(po), LLM_SUCCESS);
  Npu p(0, 1);
  int64_t pid = -1;
  Expect("prompt_register_npu", prompt.RegisterKvCache(Desc(), p.addrs, {}, pid), LLM_SUCCESS);
  Check("prompt_memory_restored", p.Row(0, 0)[0] == 100000);  // the proof of possession was put back
  Expect("decoder_initialize", decoder.Initialize(dopt), LLM_SUCCESS);
  Npu d(1, 0);
  int64_t did = -1;
  Expect("decoder_register_npu", decoder.RegisterKvCache(Desc(), d.addrs, {}, did), LLM_SUCCESS);
  ClusterInfo c{};
  c.remote_cluster_id = 1U;
  IpInfo lo{}, re{};
  lo.ip = "127.0.0.1";
  re.ip = "127.0.0.1";
  re.port = static_cast<uint16_t>(std::atoi(argv[3]));
  c.local_ip_infos.push_back(lo);
  c.remote_ip_infos.push_back(re);
  std::vector<Status> rets;
  Expect("link", decoder.LinkLlmClusters({c}, rets, 5000), LLM_SUCCESS);
  Cache dc{};
  dc.cache_id = did;
  CacheIndex src{};
  src.cluster_id = 1U;
  src.cache_id = pid;
  src.batch_index = 2U;
  Expect("pull_kv_cache", decoder.PullKvCache(src, dc, 5U), LLM_SUCCESS);
  bool ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && p.Row(t, 2) == d.Row(t, 5);
  Check("pull_kv_cache_bytes", ok);
  src.batch_index = 0U;
  Expect("pull_kv_blocks", decoder.PullKvBlocks(src, dc, {7U, 0U}, {1U, 3U}), LLM_SUCCESS);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && p.Row(t, 7) == d.Row(t, 1) && p.Row(t, 0) == d.Row(t, 3);
  Check("pull_kv_blocks_bytes", ok);
  Expect("push_kv_blocks", decoder.PushKvBlocks(dc, src, {1U}, {6U}), LLM_SUCCESS);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && p.Row(t, 6) == d.Row(t, 1);
  Check("push_kv_blocks_bytes", ok);
  // a DEVICE cache in the acl daemon's pool: imported by IPC key on this process's NPU 1 (issue 45, finding 11)
  Cache pooled{};
  Expect("allocate_device_cache", decoder.AllocateCache(Desc(), pooled), LLM_SUCCESS);
  Check("allocate_device_cache_addrs", pooled.tensor_addrs.size() == kTensors);
  if (pooled.tensor_addrs.size() == kTensors) {
    std::vector<int32_t> row(kCols, 7), back(kCols, 0);
    aclrtSetDevice(1);
    void *at = reinterpret_cast<void *>(pooled.tensor_addrs[1]);
    Check("device_cache_write", aclrtMemcpy(at, kCols * sizeof(int32_t), row.data(), kCols * sizeof(int32_t),
                                            ACL_MEMCPY_HOST_TO_DEVICE) == ACL_SUCCESS);
    aclrtMemcpy(back.data(), kCols * sizeof(int32_t), at, kCols * sizeof(int32_t), ACL_MEMCPY_DEVICE_TO_HOST);
    Check("device_cache_bytes", back == row);
  }
  Expect("unlink", decoder.UnlinkLlmClusters({c}, rets, 5000), LLM_SUCCESS);
  // export keys (issue 45, finding 11): one per tensor, shared by a cache and its blocks twin, closed by this
  // process once the daemon acknowledged the unregistration; closed at Finalize for what is still registered
  const int base = OpenExportKeys();
  if (base >= 0) {
    Npu extra(1, 5);
    bool none_left = true;
    for (int i = 0; i < 3; ++i) {
      int64_t id = -1;
      Expect("register_again", decoder.RegisterKvCache(Desc(), extra.addrs, {}, id), LLM_SUCCESS);
      none_left = none_left && OpenExportKeys() == base + static_cast<int>(kTensors);
      Expect("unregister_again", decoder.UnregisterKvCache(id), LLM_SUCCESS);
      none_left = none_left && OpenExportKeys() == base;
    }
    Check("register_unregister_leaves_no_export_key", none_left);
    int64_t first = -1, second = -1;
    Expect("register_first", decoder.RegisterKvCache(Desc(), extra.addrs, {}, first), LLM_SUCCESS);
    Expect("register_second", decoder.RegisterKvCache(Desc(), extra.addrs, {}, second), LLM_SUCCESS);
    const int closes = Closes();
    Check("one_key_per_range", OpenExportKeys() == base + static_cast<int>(kTensors));
    Expect("unregister_first", decoder.UnregisterKvCache(first), LLM_SUCCESS);
    Check("first_unregistration_closes_nothing",
          OpenExportKeys() == base + static_cast<int>(kTensors) && Closes() == closes);
    Expect("unregister_second", decoder.UnregisterKvCache(second), LLM_SUCCESS);
    Check("second_unregistration_closes_each_key_once",
          OpenExportKeys() == base && Closes() == closes + static_cast<int>(kTensors));
    Expect("register_kept", decoder.RegisterKvCache(Desc(), extra.addrs, {}, first), LLM_SUCCESS);
    decoder.Finalize();
    prompt.Finalize();
    Check("finalize_closes_every_export_key", OpenExportKeys() == 0);
  }
  decoder.Finalize();
  prompt.Finalize();
  return g_failed == 0 ? 0 : 1;
}
