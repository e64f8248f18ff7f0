// Shared by prompt.cpp and decoder.cpp: the cache both register, and how each fills it.
#ifndef DATADIST_EXAMPLES_CPP_COMMON_H_
#define DATADIST_EXAMPLES_CPP_COMMON_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "llm_datadist/llm_datadist.h"

namespace example {
using namespace llm_datadist;

constexpr uint64_t kPromptCluster = 1U;
constexpr uint64_t kDecoderCluster = 2U;
constexpr uint32_t kLayers = 2U;
constexpr uint32_t kTensors = 2U * kLayers;  // K and V per layer
constexpr int64_t kBlocks = 8;               // shape[0]: the batch size of PullKvCache, the blocks of PullKvBlocks
constexpr int64_t kBlockInts = 16;
// the first cache an engine registers is cache 1: each side names the other's by it (or by its third argument)
constexpr int64_t kFirstCacheId = 1;

// One engine's KV cache in host memory, registered with RegisterKvCache.
struct KvCache {
  std::vector<std::vector<int32_t>> tensors = std::vector<std::vector<int32_t>>(kTensors, std::vector<int32_t>(kBlocks * kBlockInts));
  int64_t cache_id = -1;

  static CacheDesc Desc() {
    CacheDesc desc{};
    desc.placement = CachePlacement::kHost;
    desc.num_tensors = kTensors;
    desc.data_type = DT_INT32;
    desc.shape = {kBlocks, kBlockInts};
    return desc;
  }
  Status Register(LlmDataDist &dd) {
    std::vector<uint64_t> addrs;
    for (auto &t : tensors) addrs.push_back(reinterpret_cast<uint64_t>(t.data()));
    return dd.RegisterKvCache(Desc(), addrs, RegisterCfg{}, cache_id);
  }
  Cache AsCache() const {
    Cache cache{};
    cache.cache_id = cache_id;
    cache.cache_desc = Desc();
    for (auto &t : tensors) cache.tensor_addrs.push_back(reinterpret_cast<uintptr_t>(t.data()));
    return cache;
  }
  // what `owner` writes into block `block` of tensor `tensor`
  static int32_t Value(uint64_t owner, uint32_t tensor, int64_t block, int64_t i) {
    return static_cast<int32_t>(owner * 1000000U + tensor * 10000U + static_cast<uint64_t>(block) * 100U + i);
  }
  void Fill(uint64_t owner) {
    for (uint32_t t = 0; t < kTensors; ++t)
      for (int64_t b = 0; b < kBlocks; ++b)
        for (int64_t i = 0; i < kBlockInts; ++i) tensors[t][b * kBlockInts + i] = Value(owner, t, b, i);
  }
  // block `block` of every tensor holds what `owner` wrote into its block `src_block`
  bool Holds(int64_t block, uint64_t owner, int64_t src_block) const {
    for (uint32_t t = 0; t < kTensors; ++t)
      for (int64_t i = 0; i < kBlockInts; ++i)
        if (tensors[t][block * kBlockInts + i] != Value(owner, t, src_block, i)) return false;
    return true;
  }
};

inline void Check(bool ok, const char *what) {
  if (!ok) {
    std::printf("[ERROR] %s\n", what);
    std::exit(1);
  }
  std::printf("[INFO] %s\n", what);
  std::fflush(stdout);
}

inline void CheckStatus(Status ret, const char *what) {
  if (ret != LLM_SUCCESS) {
    std::printf("[ERROR] %s failed, ret = 0x%X\n", what, ret);
    std::exit(1);
  }
  std::printf("[INFO] %s success\n", what);
  std::fflush(stdout);
}

// ip:port -> a ClusterInfo for LinkLlmClusters / UnlinkLlmClusters
inline ClusterInfo Remote(uint64_t cluster_id, const std::string &ip_port) {
  const size_t colon = ip_port.rfind(':');
  ClusterInfo cluster{};
  cluster.remote_cluster_id = cluster_id;
  IpInfo local{};
  local.ip = ip_port.substr(0, colon).c_str();
  IpInfo remote{};
  remote.ip = ip_port.substr(0, colon).c_str();
  remote.port = static_cast<uint16_t>(std::atoi(ip_port.c_str() + colon + 1));
  cluster.local_ip_infos.push_back(local);
  cluster.remote_ip_infos.push_back(remote);
  return cluster;
}

// The two processes need no control channel of their own: each step waits, up to kStepSeconds, for what the other
// does to show -- pushed bytes in our own registered memory, a link that went (SetRole refuses LLM_EXIST_LINK while
// one exists), a listener that came up (LinkLlmClusters succeeds). Either may start first.
constexpr int kStepSeconds = 60;

// `step` until it returns LLM_SUCCESS (or `done` says so), every 100 ms, for at most kStepSeconds; exits on failure.
template <typename Step>
inline void Retry(const char *what, Step step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kStepSeconds);
  Status ret = step();
  while (ret != LLM_SUCCESS && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ret = step();
  }
  CheckStatus(ret, what);
}

// Wait, up to kStepSeconds, until `ready()` holds (what the other side wrote into our memory); exits if it never does.
template <typename Ready>
inline void WaitFor(const char *what, Ready ready) {
  std::printf("[INFO] waiting: %s\n", what);
  std::fflush(stdout);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kStepSeconds);
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::printf("[ERROR] not within %d s: %s\n", kStepSeconds, what);
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("[INFO] %s\n", what);
  std::fflush(stdout);
}
}  // namespace example

#endif  // DATADIST_EXAMPLES_CPP_COMMON_H_
