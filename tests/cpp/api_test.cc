// The C++ API through real daemons: every method, its data and its status codes. Run by tests/cpp/test_cpp_api.py
// (which starts the daemons); one scenario per run:
//   api_test local <daemon target>                    one engine: memory, copies, roles, argument errors
//   api_test pair <target A> <target B> <port>        a prompt on A and a decoder on B in this process: transfers
//   api_test dead <target>                            READY, then (the daemon killed) every call fails cleanly
//   api_test private                                  no DATADIST_DAEMON: the library's private daemon
//   api_test private_refused                          ... refused: the per-user secret is readable by others
// Prints "ok <check>" / "FAIL <check>: ..." per check; exits 1 when a check failed.
#include <sys/mman.h>
#include <thread>
#include <algorithm>
#include <numeric>
#include <random>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
int g_failed = 0;

void Expect(const std::string &name, Status got, Status want) {
  if (got == want) {
    std::printf("ok %s\n", name.c_str());
  } else {
    std::printf("FAIL %s: got 0x%X, want 0x%X\n", name.c_str(), got, want);
    ++g_failed;
  }
  std::fflush(stdout);
}

void Check(const std::string &name, bool ok, const std::string &why = "") {
  std::printf(ok ? "ok %s\n" : "FAIL %s: %s\n", name.c_str(), why.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

constexpr uint32_t kTensors = 4U;   // 2 layers x (K, V)
constexpr int64_t kRows = 8;        // batch size / number of blocks
constexpr int64_t kCols = 16;
constexpr size_t kTensorBytes = kRows * kCols * sizeof(int32_t);
constexpr size_t kRowInts = kCols;

struct Buffers {
  std::vector<int32_t *> tensors;
  std::vector<uint64_t> addrs;
  explicit Buffers(int32_t seed) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      auto *p = new int32_t[kRows * kCols];
      for (int64_t i = 0; i < kRows * kCols; ++i) p[i] = seed == 0 ? 0 : seed * 100000 + static_cast<int32_t>(t) * 1000 + static_cast<int32_t>(i);
      tensors.push_back(p);
      addrs.push_back(reinterpret_cast<uint64_t>(p));
    }
  }
  ~Buffers() {
    for (auto *p : tensors) delete[] p;
  }
  int32_t *Row(uint32_t t, int64_t r) { return tensors[t] + r * kCols; }
};

bool SameRow(int32_t *a, int32_t *b) { return std::memcmp(a, b, kRowInts * sizeof(int32_t)) == 0; }

CacheDesc Desc(CachePlacement placement = CachePlacement::kHost) {
  CacheDesc d{};
  d.placement = placement;
  d.num_tensors = kTensors;
  d.data_type = DT_INT32;
  d.shape = {kRows, kCols};
  return d;
}

std::map<AscendString, AscendString> Options(const char *target, const std::string &listen = "") {
  std::map<AscendString, AscendString> o;
  o[OPTION_DEVICE_ID] = "0";
  o["datadist.daemon"] = target;
  o[OPTION_SYNC_CACHE_WAIT_TIME] = "3000";
  if (!listen.empty()) o[OPTION_LISTEN_IP_INFO] = listen.c_str();
  return o;
}

ClusterInfo Cluster(uint64_t id, uint16_t port) {
  ClusterInfo c{};
  c.remote_cluster_id = id;
  IpInfo local{};
  local.ip = "127.0.0.1";
  IpInfo remote{};
  remote.ip = "127.0.0.1";
  remote.port = port;
  c.local_ip_infos.push_back(local);
  c.remote_ip_infos.push_back(remote);
  return c;
}

Cache AsCache(int64_t id, const Buffers &b) {
  Cache c{};
  c.cache_id = id;
  c.cache_desc = Desc();
  c.tensor_addrs.assign(b.addrs.begin(), b.addrs.end());
  return c;
}

CacheIndex Index(uint64_t cluster, int64_t id, uint32_t batch = 0U) {
  CacheIndex i{};
  i.cluster_id = cluster;
  i.cache_id = id;
  i.batch_index = batch;
  return i;
}

void AscendStrings() {
  std::map<AscendString, AscendString> m;
  m["b"] = "2";
  m["a"] = "1";
  m[AscendString("ab", 2)] = "3";
  AscendString copy = m["a"];
  AscendString moved(std::move(copy));
  Check("ascend_string_map_key", m.size() == 3U && std::string(m.begin()->first.GetString()) == "a" &&
                                     std::string(moved.GetString()) == "1" && AscendString("x") == AscendString("x") &&
                                     AscendString("a") < AscendString("ab") && AscendString().GetLength() == 0U &&
                                     std::string(AscendString(nullptr).GetString()).empty());
  std::unordered_map<AscendString, int> hashed{{"k", 1}};
  Check("ascend_string_hash_and_find", hashed.count(AscendString("k", 1)) == 1U &&
                                           AscendString("llm.DeviceId").Find("Device") == 4U &&
                                           AscendString("abc").Find("x") == static_cast<size_t>(-1));
}

int Local(const char *target) {
  AscendStrings();
  LlmDataDist dd(1U, LlmRole::kPrompt);
  Cache none{};
  int64_t id = -1;
  Expect("before_initialize_register", dd.RegisterKvCache(Desc(), {1U, 2U, 3U, 4U}, {}, id), LLM_FAILED);
  Expect("before_initialize_pull", dd.PullKvCache(Index(2U, 0), none), LLM_FAILED);
  std::map<AscendString, AscendString> no_device = Options(target);
  no_device.erase(OPTION_DEVICE_ID);
  Expect("initialize_without_device_id", dd.Initialize(no_device), LLM_PARAM_INVALID);
  Expect("initialize_bad_listen", dd.Initialize(Options(target, "127.0.0.1")), LLM_PARAM_INVALID);
  std::map<AscendString, AscendString> nobody = Options("unix:///nonexistent/datadistd.sock");
  Expect("initialize_no_daemon", dd.Initialize(nobody), LLM_FAILED);
  Expect("initialize_other_scheme", dd.Initialize(Options("tcp://127.0.0.1:1")), LLM_PARAM_INVALID);
  std::map<AscendString, AscendString> opts = Options(target);
  opts["llm.MemPoolConfig"] = "{\"memory_size\": 1048576, \"page_shift\": 16}";
  Expect("initialize", dd.Initialize(opts), LLM_SUCCESS);
  Expect("initialize_again", dd.Initialize(opts), LLM_SUCCESS);

  Buffers a(1), b(0);
  int64_t ida = -1, idb = -1;
  Expect("register_host", dd.RegisterKvCache(Desc(), a.addrs, {}, ida), LLM_SUCCESS);
  Expect("register_device_placement", dd.RegisterKvCache(Desc(CachePlacement::kDevice), b.addrs, {}, idb), LLM_SUCCESS);
  Check("register_ids", ida >= 0 && idb >= 0 && ida != idb);
  Check("register_keeps_contents", a.Row(3, 5)[7] == 100000 + 3000 + 5 * kCols + 7);
  int64_t bad = -1;
  Expect("register_addr_count", dd.RegisterKvCache(Desc(), {a.addrs[0]}, {}, bad), LLM_PARAM_INVALID);
  Expect("register_zero_addr", dd.RegisterKvCache(Desc(), {a.addrs[0], 0U, a.addrs[2], a.addrs[3]}, {}, bad),
         LLM_PARAM_INVALID);
  CacheDesc bad_type = Desc();
  bad_type.data_type = DT_STRING;
  Expect("register_bad_dtype", dd.RegisterKvCache(bad_type, a.addrs, {}, bad), LLM_PARAM_INVALID);
  CacheDesc bad_shape = Desc();
  bad_shape.shape = {kRows, 0};
  Expect("register_bad_shape", dd.RegisterKvCache(bad_shape, a.addrs, {}, bad), LLM_PARAM_INVALID);
  static const char kReadOnly[kTensorBytes * 4] = {1};
  std::vector<uint64_t> ro;
  for (uint32_t t = 0; t < kTensors; ++t) ro.push_back(reinterpret_cast<uint64_t>(kReadOnly + t * kTensorBytes));
  Expect("register_read_only_memory", dd.RegisterKvCache(Desc(), ro, {}, bad), LLM_PARAM_INVALID);
  void *unmapped = mmap(nullptr, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  (void)munmap(unmapped, 1 << 20);
  const uint64_t u = reinterpret_cast<uint64_t>(unmapped);
  Expect("register_unmapped_memory", dd.RegisterKvCache(Desc(), {u, u, u, u}, {}, bad), LLM_PARAM_INVALID);

  // local copies
  Cache ca = AsCache(ida, a), cb = AsCache(idb, b);
  Expect("copy_kv_cache", dd.CopyKvCache(ca, cb, 2U, 5U), LLM_SUCCESS);
  bool copied = true;
  for (uint32_t t = 0; t < kTensors; ++t) copied = copied && SameRow(a.Row(t, 2), b.Row(t, 5));
  Check("copy_kv_cache_bytes", copied);
  Expect("copy_kv_cache_batch_out_of_range", dd.CopyKvCache(ca, cb, kRows, 0U), LLM_PARAM_INVALID);
  Expect("copy_kv_cache_unknown_id", dd.CopyKvCache(AsCache(9999, a), cb), LLM_KV_CACHE_NOT_EXIST);
  Expect("copy_kv_blocks_same_cache", dd.CopyKvBlocks(ca, ca, {0U, 1U}, {{6U, 7U}, {4U, 5U}}), LLM_SUCCESS);
  bool fanned = true;
  for (uint32_t t = 0; t < kTensors; ++t) {
    fanned = fanned && SameRow(a.Row(t, 0), a.Row(t, 6)) && SameRow(a.Row(t, 0), a.Row(t, 4)) &&
             SameRow(a.Row(t, 1), a.Row(t, 7)) && SameRow(a.Row(t, 1), a.Row(t, 5));
  }
  Check("copy_kv_blocks_bytes", fanned);
  Expect("copy_kv_blocks_out_of_range", dd.CopyKvBlocks(ca, ca, {0U}, {{kRows}}), LLM_PARAM_INVALID);
  Expect("copy_kv_blocks_length_mismatch", dd.CopyKvBlocks(ca, ca, {0U, 1U}, {{2U}}), LLM_PARAM_INVALID);
  Expect("copy_kv_blocks_unknown_cache", dd.CopyKvBlocks(AsCache(9999, a), ca, {0U}, {{1U}}), LLM_KV_CACHE_NOT_EXIST);
  Expect("copy_kv_blocks_host_to_device", dd.CopyKvBlocks(ca, cb, {3U}, {{0U}}), LLM_SUCCESS);
  bool swapped = true;
  for (uint32_t t = 0; t < kTensors; ++t) swapped = swapped && SameRow(a.Row(t, 3), b.Row(t, 0));
  Check("copy_kv_blocks_host_to_device_bytes", swapped);

  // daemon-allocated memory, mapped here
  Cache alloc{};
  Expect("allocate_cache", dd.AllocateCache(Desc(CachePlacement::kDevice), alloc), LLM_SUCCESS);
  Check("allocate_cache_addrs", alloc.cache_id >= 0 && alloc.tensor_addrs.size() == kTensors);
  if (alloc.tensor_addrs.size() == kTensors) {
    reinterpret_cast<int32_t *>(alloc.tensor_addrs[1])[0] = 4242;  // usable in this process
    Expect("copy_into_allocated", dd.CopyKvCache(ca, alloc, 1U, 2U), LLM_SUCCESS);
    Check("allocated_bytes", SameRow(a.Row(2, 1), reinterpret_cast<int32_t *>(alloc.tensor_addrs[2]) + 2 * kCols) &&
                                 reinterpret_cast<int32_t *>(alloc.tensor_addrs[1])[0] == 4242);
    Expect("copy_kv_blocks_allocated", dd.CopyKvBlocks(alloc, alloc, {2U}, {{3U}}), LLM_SUCCESS);
  }
  Expect("deallocate_cache", dd.DeallocateCache(alloc.cache_id), LLM_SUCCESS);
  Expect("deallocate_unknown", dd.DeallocateCache(9999), LLM_SUCCESS);
  CacheDesc huge = Desc(CachePlacement::kDevice);
  huge.shape = {1 << 20, kCols};
  Cache none2{};
  Expect("allocate_out_of_pool", dd.AllocateCache(huge, none2), LLM_OUT_OF_MEMORY);

  // transfers that cannot start here
  Expect("pull_unlinked_cluster", dd.PullKvCache(Index(7U, 0), cb), LLM_NOT_YET_LINK);
  Expect("pull_blocks_unlinked_cluster", dd.PullKvBlocks(Index(7U, 0), cb, {0U}, {1U}), LLM_NOT_YET_LINK);
  Expect("push_unlinked_cluster", dd.PushKvCache(ca, Index(7U, 0)), LLM_NOT_YET_LINK);
  Expect("push_blocks_unlinked_cluster", dd.PushKvBlocks(ca, Index(7U, 0), {0U}, {1U}), LLM_NOT_YET_LINK);
  Expect("pull_own_cluster", dd.PullKvCache(Index(1U, 0), cb), LLM_PARAM_INVALID);
  Expect("pull_blocks_unknown_local_cache", dd.PullKvBlocks(Index(7U, 0), AsCache(9999, b), {0U}, {1U}),
         LLM_PARAM_INVALID);
  KvCacheExtParam reversed{};
  reversed.src_layer_range = {1, 0};
  Expect("layer_range_reversed", dd.PullKvCache(Index(7U, 0), cb, 0U, -1, reversed), LLM_PARAM_INVALID);
  KvCacheExtParam half{};
  half.src_layer_range = {-1, 1};
  Expect("layer_range_half_all", dd.PullKvCache(Index(7U, 0), cb, 0U, -1, half), LLM_PARAM_INVALID);
  KvCacheExtParam zero{};
  zero.tensor_num_per_layer = 0U;
  Expect("tensor_num_per_layer_zero", dd.PullKvBlocks(Index(7U, 0), cb, {0U}, {1U}, zero), LLM_PARAM_INVALID);
  Expect("pull_bad_size", dd.PullKvCache(Index(7U, 0), cb, 0U, 0), LLM_PARAM_INVALID);
  Expect("push_size_not_minus_one", dd.PushKvCache(ca, Index(7U, 0), 0U, 16), LLM_PARAM_INVALID);
  Expect("pull_blocks_length_mismatch", dd.PullKvBlocks(Index(7U, 0), cb, {0U, 1U}, {1U}), LLM_PARAM_INVALID);
  Expect("pull_blocks_batch_index", dd.PullKvBlocks(Index(7U, 0, 1U), cb, {0U}, {1U}), LLM_PARAM_INVALID);

  // links and roles
  std::vector<Status> rets;
  Expect("link_timeout_zero", dd.LinkLlmClusters({Cluster(7U, 1U)}, rets, 0), LLM_PARAM_INVALID);
  Expect("link_empty", dd.LinkLlmClusters({}, rets), LLM_PARAM_INVALID);
  std::vector<ClusterInfo> many;
  for (uint64_t i = 0; i < 17U; ++i) many.push_back(Cluster(100U + i, 1U));
  Expect("link_too_many", dd.LinkLlmClusters(many, rets), LLM_CLUSTER_NUM_EXCEED_LIMIT);
  Expect("set_role_bad_listen", dd.SetRole(LlmRole::kPrompt, {{OPTION_LISTEN_IP_INFO, "nowhere"}}), LLM_PARAM_INVALID);
  Expect("set_role_decoder", dd.SetRole(LlmRole::kDecoder), LLM_SUCCESS);
  Expect("set_role_prompt", dd.SetRole(LlmRole::kPrompt), LLM_SUCCESS);

  Expect("unregister", dd.UnregisterKvCache(ida), LLM_SUCCESS);
  Expect("unregister_again", dd.UnregisterKvCache(ida), LLM_SUCCESS);
  Expect("unregister_unknown", dd.UnregisterKvCache(12345), LLM_SUCCESS);
  Expect("copy_after_unregister", dd.CopyKvCache(ca, cb), LLM_KV_CACHE_NOT_EXIST);
  dd.Finalize();
  dd.Finalize();
  Expect("after_finalize", dd.UnregisterKvCache(idb), LLM_FAILED);
  return g_failed == 0 ? 0 : 1;
}

int Pair(const char *target_a, const char *target_b, int port) {
  constexpr uint64_t kP = 1U, kD = 2U;
  const std::string listen = "127.0.0.1:" + std::to_string(port);
  LlmDataDist prompt(kP, LlmRole::kPrompt), decoder(kD, LlmRole::kDecoder);
  Expect("prompt_initialize", prompt.Initialize(Options(target_a, listen)), LLM_SUCCESS);
  Expect("decoder_initialize", decoder.Initialize(Options(target_b)), LLM_SUCCESS);
  Buffers p(1), d(0);
  int64_t pid = -1, did = -1;
  Expect("prompt_register", prompt.RegisterKvCache(Desc(), p.addrs, {}, pid), LLM_SUCCESS);
  Expect("decoder_register", decoder.RegisterKvCache(Desc(), d.addrs, {}, did), LLM_SUCCESS);
  Cache pc = AsCache(pid, p), dc = AsCache(did, d);

  Expect("pull_before_link", decoder.PullKvCache(Index(kP, pid), dc), LLM_NOT_YET_LINK);
  std::vector<Status> rets;
  Expect("link", decoder.LinkLlmClusters({Cluster(kP, static_cast<uint16_t>(port))}, rets), LLM_SUCCESS);
  Check("link_rets", rets.size() == 1U && rets[0] == LLM_SUCCESS);
  const Status again = decoder.LinkLlmClusters({Cluster(kP, static_cast<uint16_t>(port))}, rets);
  Check("link_again_rets", again != LLM_SUCCESS && rets.size() == 1U && rets[0] == LLM_ALREADY_LINK);

  // PullKvCache: batch 3 of the prompt into batch 6 here
  Expect("pull_kv_cache", decoder.PullKvCache(Index(kP, pid, 3U), dc, 6U), LLM_SUCCESS);
  bool ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && SameRow(p.Row(t, 3), d.Row(t, 6));
  Check("pull_kv_cache_bytes", ok);
  // one layer (tensors 2, 3) of batch 1 into layer 0 (tensors 0, 1) of batch 0
  KvCacheExtParam layer{};
  layer.src_layer_range = {1, 1};
  layer.dst_layer_range = {0, 0};
  Expect("pull_kv_cache_layer", decoder.PullKvCache(Index(kP, pid, 1U), dc, 0U, -1, layer), LLM_SUCCESS);
  Check("pull_kv_cache_layer_bytes", SameRow(p.Row(2, 1), d.Row(0, 0)) && SameRow(p.Row(3, 1), d.Row(1, 0)));
  // PullKvBlocks with shuffled tables
  Expect("pull_kv_blocks", decoder.PullKvBlocks(Index(kP, pid), dc, {0U, 5U, 2U}, {7U, 1U, 4U}), LLM_SUCCESS);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) {
    ok = ok && SameRow(p.Row(t, 0), d.Row(t, 7)) && SameRow(p.Row(t, 5), d.Row(t, 1)) && SameRow(p.Row(t, 2), d.Row(t, 4));
  }
  Check("pull_kv_blocks_bytes", ok);
  KvCacheExtParam per_one{};
  per_one.src_layer_range = {3, 3};
  per_one.dst_layer_range = {2, 2};
  per_one.tensor_num_per_layer = 1U;
  Expect("pull_kv_blocks_one_tensor_layer", decoder.PullKvBlocks(Index(kP, pid), dc, {6U}, {2U}, per_one), LLM_SUCCESS);
  Check("pull_kv_blocks_one_tensor_layer_bytes", SameRow(p.Row(3, 6), d.Row(2, 2)));
  // PushKvCache: batch 6 here into batch 7 of the prompt
  Expect("push_kv_cache", decoder.PushKvCache(dc, Index(kP, pid, 7U), 6U), LLM_SUCCESS);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && SameRow(d.Row(t, 6), p.Row(t, 7));
  Check("push_kv_cache_bytes", ok);
  d.Row(0, 4)[0] = 777;
  Expect("push_kv_blocks", decoder.PushKvBlocks(dc, Index(kP, pid), {4U}, {1U}), LLM_SUCCESS);
  ok = p.Row(0, 1)[0] == 777;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && SameRow(d.Row(t, 4), p.Row(t, 1));
  Check("push_kv_blocks_bytes", ok);

  // errors through the link
  Expect("pull_unknown_remote_cache", decoder.PullKvCache(Index(kP, 9999), dc), LLM_KV_CACHE_NOT_EXIST);
  Expect("pull_blocks_unknown_remote_cache", decoder.PullKvBlocks(Index(kP, 9999), dc, {0U}, {0U}),
         LLM_KV_CACHE_NOT_EXIST);
  Expect("push_unknown_remote_cache", decoder.PushKvCache(dc, Index(kP, 9999)), LLM_KV_CACHE_NOT_EXIST);
  Expect("pull_remote_batch_out_of_range", decoder.PullKvCache(Index(kP, pid, kRows), dc), LLM_KV_CACHE_NOT_EXIST);
  Expect("pull_blocks_remote_out_of_range", decoder.PullKvBlocks(Index(kP, pid), dc, {kRows}, {0U}), LLM_PARAM_INVALID);
  Expect("pull_blocks_local_out_of_range", decoder.PullKvBlocks(Index(kP, pid), dc, {0U}, {kRows + 3}),
         LLM_PARAM_INVALID);
  Expect("push_blocks_remote_out_of_range", decoder.PushKvBlocks(dc, Index(kP, pid), {0U}, {kRows}), LLM_PARAM_INVALID);
  KvCacheExtParam uneven{};
  uneven.src_layer_range = {0, 1};
  uneven.dst_layer_range = {0, 0};
  Expect("layer_ranges_differ", decoder.PullKvCache(Index(kP, pid), dc, 0U, -1, uneven), LLM_PARAM_INVALID);
  KvCacheExtParam beyond{};
  beyond.src_layer_range = {2, 2};
  beyond.dst_layer_range = {2, 2};
  Expect("layer_range_beyond_cache", decoder.PullKvBlocks(Index(kP, pid), dc, {0U}, {0U}, beyond), LLM_PARAM_INVALID);
  Expect("pull_unknown_local_cache", decoder.PullKvCache(Index(kP, pid), AsCache(9999, d)), LLM_PARAM_INVALID);
  Expect("pull_unlinked_other_cluster", decoder.PullKvCache(Index(5U, pid), dc), LLM_NOT_YET_LINK);
  Expect("set_role_with_links", decoder.SetRole(LlmRole::kPrompt), LLM_EXIST_LINK);

  // block lists too long for one attach datagram go as attach continuation frames: 20000 + 20000 block numbers
  constexpr int64_t kMany = 20000;
  CacheDesc many_desc = Desc();
  many_desc.shape = {kMany, 1};
  std::vector<std::vector<int32_t>> pm(kTensors, std::vector<int32_t>(kMany)), dm(kTensors, std::vector<int32_t>(kMany));
  std::vector<uint64_t> pm_addrs, dm_addrs;
  for (uint32_t t = 0; t < kTensors; ++t) {
    std::iota(pm[t].begin(), pm[t].end(), static_cast<int32_t>(t) * 1000000);
    pm_addrs.push_back(reinterpret_cast<uint64_t>(pm[t].data()));
    dm_addrs.push_back(reinterpret_cast<uint64_t>(dm[t].data()));
  }
  int64_t pmid = -1, dmid = -1;
  Expect("prompt_register_many", prompt.RegisterKvCache(many_desc, pm_addrs, {}, pmid), LLM_SUCCESS);
  Expect("decoder_register_many", decoder.RegisterKvCache(many_desc, dm_addrs, {}, dmid), LLM_SUCCESS);
  std::vector<uint64_t> src_list(kMany), dst_list(kMany);
  std::iota(src_list.begin(), src_list.end(), 0U);
  std::iota(dst_list.begin(), dst_list.end(), 0U);
  std::shuffle(dst_list.begin(), dst_list.end(), std::mt19937(7));
  Cache dmc{};
  dmc.cache_id = dmid;
  Expect("pull_20000_blocks", decoder.PullKvBlocks(Index(kP, pmid), dmc, src_list, dst_list), LLM_SUCCESS);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t)
    for (int64_t i = 0; i < kMany; ++i) ok = ok && dm[t][dst_list[i]] == pm[t][src_list[i]];
  Check("pull_20000_blocks_bytes", ok);
  // eight threads of one engine pull at once (one waits on the attach connection, the others go by gRPC)
  for (auto &t : dm) std::fill(t.begin(), t.end(), 0);
  std::vector<std::thread> threads;
  std::vector<Status> results(8, LLM_FAILED);
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      Status last = LLM_SUCCESS;
      for (int64_t b = w; b < 400 && last == LLM_SUCCESS; b += 8) {
        last = decoder.PullKvBlocks(Index(kP, pmid), dmc, {static_cast<uint64_t>(b)}, {static_cast<uint64_t>(b + 1000)});
      }
      results[w] = last;
    });
  }
  for (auto &t : threads) t.join();
  ok = std::all_of(results.begin(), results.end(), [](Status r) { return r == LLM_SUCCESS; });
  Check("pull_from_8_threads", ok);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t)
    for (int64_t b = 0; b < 400; ++b) ok = ok && dm[t][b + 1000] == pm[t][b];
  Check("pull_from_8_threads_bytes", ok);
  Expect("prompt_unregister_many", prompt.UnregisterKvCache(pmid), LLM_SUCCESS);
  Expect("decoder_unregister_many", decoder.UnregisterKvCache(dmid), LLM_SUCCESS);

  Expect("unlink", decoder.UnlinkLlmClusters({Cluster(kP, static_cast<uint16_t>(port))}, rets), LLM_SUCCESS);
  Check("unlink_rets", rets.size() == 1U && rets[0] == LLM_SUCCESS);
  Expect("pull_after_unlink", decoder.PullKvCache(Index(kP, pid), dc), LLM_NOT_YET_LINK);
  // roles switch: the decoder listens, the prompt links to it and pulls
  const std::string listen_b = "127.0.0.1:" + std::to_string(port + 1);
  Expect("decoder_becomes_prompt",
         decoder.SetRole(LlmRole::kPrompt, {{OPTION_LISTEN_IP_INFO, listen_b.c_str()}}), LLM_SUCCESS);
  Expect("prompt_becomes_decoder", prompt.SetRole(LlmRole::kDecoder), LLM_SUCCESS);
  Expect("link_switched", prompt.LinkLlmClusters({Cluster(kD, static_cast<uint16_t>(port + 1))}, rets), LLM_SUCCESS);
  Expect("pull_switched", prompt.PullKvBlocks(Index(kD, did), pc, {6U}, {0U}), LLM_SUCCESS);
  ok = true;
  for (uint32_t t = 0; t < kTensors; ++t) ok = ok && SameRow(d.Row(t, 6), p.Row(t, 0));
  Check("pull_switched_bytes", ok);
  Expect("unlink_switched", prompt.UnlinkLlmClusters({Cluster(kD, static_cast<uint16_t>(port + 1))}, rets), LLM_SUCCESS);
  Expect("prompt_unregister", prompt.UnregisterKvCache(pid), LLM_SUCCESS);
  Expect("decoder_unregister", decoder.UnregisterKvCache(did), LLM_SUCCESS);
  prompt.Finalize();
  decoder.Finalize();
  return g_failed == 0 ? 0 : 1;
}

int Dead(const char *target) {
  LlmDataDist dd(1U, LlmRole::kDecoder);
  Expect("initialize", dd.Initialize(Options(target)), LLM_SUCCESS);
  Buffers a(1);
  int64_t id = -1;
  Expect("register", dd.RegisterKvCache(Desc(), a.addrs, {}, id), LLM_SUCCESS);
  std::printf("READY\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);  // the test kills the daemon, then writes a line
  Cache c = AsCache(id, a);
  std::vector<Status> rets;
  Expect("dead_pull", dd.PullKvCache(Index(2U, 0), c), LLM_FAILED);
  Expect("dead_pull_blocks", dd.PullKvBlocks(Index(2U, 0), c, {0U}, {0U}), LLM_FAILED);
  Expect("dead_push", dd.PushKvCache(c, Index(2U, 0)), LLM_FAILED);
  Expect("dead_link", dd.LinkLlmClusters({Cluster(2U, 1U)}, rets), LLM_FAILED);
  Expect("dead_register", dd.RegisterKvCache(Desc(), a.addrs, {}, id), LLM_FAILED);
  Expect("dead_copy", dd.CopyKvCache(c, c), LLM_FAILED);
  Expect("dead_set_role", dd.SetRole(LlmRole::kPrompt), LLM_FAILED);
  dd.Finalize();
  Check("dead_finalize", true);
  return g_failed == 0 ? 0 : 1;
}

int Private() {
  LlmDataDist dd(1U, LlmRole::kPrompt);
  std::map<AscendString, AscendString> o;
  o[OPTION_DEVICE_ID] = "0";
  Expect("private_initialize", dd.Initialize(o), LLM_SUCCESS);
  Buffers a(1), b(0);
  int64_t ida = -1, idb = -1;
  Expect("private_register", dd.RegisterKvCache(Desc(), a.addrs, {}, ida), LLM_SUCCESS);
  Expect("private_register_b", dd.RegisterKvCache(Desc(), b.addrs, {}, idb), LLM_SUCCESS);
  Expect("private_copy", dd.CopyKvCache(AsCache(ida, a), AsCache(idb, b)), LLM_SUCCESS);
  Check("private_copy_bytes", SameRow(a.Row(1, 0), b.Row(1, 0)));
  dd.Finalize();
  return g_failed == 0 ? 0 : 1;
}

// the per-user peer secret is not this user's alone: no private daemon is started with it
int PrivateRefused() {
  LlmDataDist dd(1U, LlmRole::kPrompt);
  std::map<AscendString, AscendString> o;
  o[OPTION_DEVICE_ID] = "0";
  Expect("private_unsafe_secret", dd.Initialize(o), LLM_FAILED);
  return g_failed == 0 ? 0 : 1;
}
}  // namespace

int main(int argc, char **argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "local" && argc == 3) return Local(argv[2]);
  if (scenario == "pair" && argc == 5) return Pair(argv[2], argv[3], std::atoi(argv[4]));
  if (scenario == "dead" && argc == 3) return Dead(argv[2]);
  if (scenario == "private" && argc == 2) return Private();
  if (scenario == "private_refused" && argc == 2) return PrivateRefused();
  std::fprintf(stderr, "usage: api_test local TARGET | pair TARGET_A TARGET_B PORT | dead TARGET | private\n");
  return 2;
}
