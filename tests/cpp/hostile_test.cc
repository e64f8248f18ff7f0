// The C++ client against whatever listens on its daemon's socket (tests/hostile_daemon.py, or another user's
// listener in a squatted directory). Run by tests/cpp/test_cpp_hostile.py and tests/security/test_squat.py:
//   hostile_test <daemon target>
// Initializes, allocates a blocks cache of two tensors and writes every byte of it, then finalizes. Prints
// "initialize <status>", then "allocate <status>", then "touched" once every byte was written; exit 0 unless a
// step crashed (the point: a refusal is a status, never a fault).
#include <cstdio>
#include <cstring>
#include <map>

#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hostile_test TARGET\n");
    return 2;
  }
  LlmDataDist dd(1U, LlmRole::kDecoder);
  std::map<AscendString, AscendString> opts;
  opts[OPTION_DEVICE_ID] = "0";
  opts["datadist.daemon"] = argv[1];
  opts["llm.MemPoolConfig"] = "{\"memory_size\": 1048576}";
  const Status init = dd.Initialize(opts);
  std::printf("initialize 0x%X\n", init);
  std::fflush(stdout);
  if (init != LLM_SUCCESS) return 0;
  CacheDesc desc{};
  desc.num_tensors = 2U;
  desc.data_type = DT_UINT8;
  desc.shape = {8, 4096};
  desc.placement = CachePlacement::kHost;
  Cache cache{};
  const Status alloc = dd.AllocateCache(desc, cache);
  std::printf("allocate 0x%X\n", alloc);
  std::fflush(stdout);
  if (alloc == LLM_SUCCESS) {
    for (uint64_t addr : cache.tensor_addrs) {
      std::memset(reinterpret_cast<void *>(addr), 3, 8 * 4096);
    }
    std::printf("touched\n");
    std::fflush(stdout);
  }
  dd.Finalize();
  return 0;
}
