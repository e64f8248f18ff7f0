// llm_datadist::LlmDataDist over datadistd: the C++ counterpart of the Python client (client/llm_datadist), same
// daemon protocols (gRPC DataDist on the worker socket, the attach socket beside it), same status codes.
//
// CANN's C++ API names every cache by its cache_id, blocks caches included (PullKvBlocks / PushKvBlocks take a
// CacheIndex), and RegisterKvCache does not say whether a cache is used as batches or as blocks. The daemon, like
// CANN's Python API, keeps the two apart (a blocks cache is addressed by its BlocksCacheKey). So each cache of this
// library is two daemon caches over the same memory: the contiguous one whose id the caller gets, and a blocks
// twin bound to BlocksCacheKey(cluster_id, model_id = that id). PullKvBlocks / PushKvBlocks name the remote
// twin by that key and use the local twin; PullKvCache / PushKvCache use the contiguous caches.
#include "llm_datadist/llm_datadist.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attach.h"
#include "common.h"
#include "daemon.h"
#include "datadist/v1/datadist.grpc.pb.h"
#include "npu.h"
#include "private_daemon.h"
#include "share.h"

namespace llm_datadist {
using datadist_cpp::Fail;
using datadist_cpp::Log;
using datadist_cpp::LogLevel;
namespace pb = datadist::v1;

namespace {
using datadist_cpp::kCapabilityKey;
using datadist_cpp::kDaemonEnv;
using datadist_cpp::kDaemonOption;
using datadist_cpp::NobodyListens;
using datadist_cpp::UnixPath;
constexpr int kRpcTimeoutMs = 60000;
constexpr int kRpcMarginMs = 5000;
constexpr size_t kMaxRegisteredAddrs = 240U;
constexpr size_t kMaxClusters = 16U;

size_t ItemSize(DataType t) {
  switch (t) {
    case DT_FLOAT: case DT_INT32: case DT_UINT32: return 4U;
    case DT_FLOAT16: case DT_INT16: case DT_UINT16: case DT_BF16: return 2U;
    case DT_INT8: case DT_UINT8: case DT_BOOL: return 1U;
    case DT_INT64: case DT_UINT64: case DT_DOUBLE: return 8U;
    default: return 0U;
  }
}

std::string Str(const AscendString &s) { return std::string(s.GetString(), s.GetLength()); }

bool Digits(const std::string &s) {
  if (s.empty() || s.size() > 9U) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// "ip:port" exactly (one address)
bool SplitListen(const std::string &info, std::string *ip, std::string *port) {
  const size_t colon = info.rfind(':');
  if (colon == std::string::npos || colon == 0U || info.find(';') != std::string::npos) return false;
  *ip = info.substr(0, colon);
  *port = info.substr(colon + 1U);
  return Digits(*port) && std::stoul(*port) <= 65535U;
}

// C++ inclusive layer pair -> half-open [start, stop); {-1, -1} = all layers (absent)
bool LayerRange(const char *func, const char *name, const std::pair<int32_t, int32_t> &r, pb::LayerRange *out,
                bool *given, Status *st) {
  *given = false;
  if (r.first == -1 && r.second == -1) return true;
  if (r.first < 0 || r.second < 0 || r.first > r.second) {
    *st = Fail(func, LLM_PARAM_INVALID, std::string(name) + " {" + std::to_string(r.first) + ", " +
                                            std::to_string(r.second) + "} is invalid: {first, second} with 0 <= "
                                            "first <= second, or {-1, -1} for all layers");
    return false;
  }
  out->set_start(r.first);
  out->set_stop(static_cast<int64_t>(r.second) + 1);
  *given = true;
  return true;
}

struct PoolMap {
  void *base = nullptr;
  uint64_t size = 0U;
  int fd = -1;
  std::string device_key;  // an NPU pool imported by IPC key (closed at Finalize), on logical NPU `device`
  int32_t device = -1;
};

struct CacheRecord {
  int64_t twin = -1;              // the blocks twin's daemon cache id
  bool allocated = false;         // AllocateCache (else RegisterKvCache)
  CacheDesc desc;
};
}  // namespace

class __attribute__((visibility("hidden"))) LlmDataDist::LlmDataDistImpl {
 public:
  LlmDataDistImpl(uint64_t cluster_id, LlmRole role) : cluster_id_(cluster_id), role_(role) {}
  ~LlmDataDistImpl() { Finalize(); }

  Status Initialize(const std::map<AscendString, AscendString> &options);
  void Finalize();
  Status SetRole(LlmRole role, const std::map<AscendString, AscendString> &options);
  Status Link(bool unlink, const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout,
              bool force);
  Status AllocateCache(const CacheDesc &desc, Cache &cache);
  Status DeallocateCache(int64_t cache_id);
  Status RegisterKvCache(const CacheDesc &desc, const std::vector<uint64_t> &addrs, int64_t &cache_id);
  Status UnregisterKvCache(int64_t cache_id);
  Status Transfer(const char *func, bool push, bool blocks, const CacheIndex &remote, const Cache &local,
                  const std::vector<uint64_t> &remote_blocks, const std::vector<uint64_t> &local_blocks,
                  uint32_t local_batch_index, int64_t size, const KvCacheExtParam &ext);
  Status CopyKvCache(const Cache &src, const Cache &dst, uint32_t src_batch, uint32_t dst_batch, uint64_t offset,
                     int64_t size);
  Status CopyKvBlocks(const Cache &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                      const std::vector<std::vector<uint64_t>> &dst_blocks_list);

 private:
  template <typename Req, typename Resp>
  using Method = grpc::Status (pb::DataDist::Stub::*)(grpc::ClientContext *, const Req &, Resp *);

  template <typename Req, typename Resp>
  Status Rpc(Method<Req, Resp> method, const Req &req, Resp *resp, const char *func, int timeout_ms = kRpcTimeoutMs);
  Status CheckInit(const char *func) const;
  Status Register(const char *func, const CacheDesc &desc, const std::vector<uint64_t> &addrs, bool is_blocks,
                  int64_t model_id, int64_t *cache_id);
  Status HandOver(const char *func, uint64_t addr, uint64_t size, bool npu, pb::WorkerMemory *mem,
                  std::vector<datadist_cpp::ExportRange> *held);
  void DropExports(int64_t cache_id);
  Status MapPool(const char *func, const pb::SharedExport &t, uint64_t *addr);
  bool Twin(int64_t cache_id, int64_t *twin, CacheDesc *desc);
  void ReleaseAttached(const pb::RegisterCacheRequest &req);

  const uint64_t cluster_id_;
  LlmRole role_;
  bool initialized_ = false;
  bool linked_once_ = false;
  uint64_t engine_id_ = 0U;
  int32_t device_id_ = 0;
  int sync_timeout_ms_ = 1000;
  std::unique_ptr<datadist_cpp::PrivateDaemon> private_daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::DataDist::Stub> stub_;
  datadist_cpp::AttachClient attach_;
  std::mutex mu_;                         // caches_, pools_
  std::map<int64_t, CacheRecord> caches_;
  std::map<std::string, PoolMap> pools_;
  std::map<int64_t, std::vector<datadist_cpp::ExportRange>> exports_;  // cache id -> its export keys' ranges
};

// ---- plumbing ---------------------------------------------------------------------------------------------------

template <typename Req, typename Resp>
Status LlmDataDist::LlmDataDistImpl::Rpc(Method<Req, Resp> method, const Req &req, Resp *resp, const char *func,
                                         int timeout_ms) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  ctx.AddMetadata(kCapabilityKey, attach_.capability_hex());
  const grpc::Status st = (stub_.get()->*method)(&ctx, req, resp);
  if (st.ok()) return LLM_SUCCESS;
  std::string why;
  const int64_t code = datadist_cpp::FailedCallCode(ctx, st, &why);
  return Fail(func, datadist_cpp::CodeToStatus(code), why);
}

Status LlmDataDist::LlmDataDistImpl::CheckInit(const char *func) const {
  if (!initialized_) return Fail(func, LLM_FAILED, "llm datadist is not initialized (call Initialize first)");
  return LLM_SUCCESS;
}

bool LlmDataDist::LlmDataDistImpl::Twin(int64_t cache_id, int64_t *twin, CacheDesc *desc) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = caches_.find(cache_id);
  if (it == caches_.end()) return false;
  *twin = it->second.twin;
  if (desc != nullptr) *desc = it->second.desc;
  return true;
}

// ---- life cycle -------------------------------------------------------------------------------------------------

Status LlmDataDist::LlmDataDistImpl::Initialize(const std::map<AscendString, AscendString> &options) {
  static const char *const kFunc = "Initialize";
  if (initialized_) return LLM_SUCCESS;
  if (role_ != LlmRole::kPrompt && role_ != LlmRole::kDecoder && role_ != LlmRole::kMix) {
    return Fail(kFunc, LLM_PARAM_INVALID, "role must be kPrompt, kDecoder or kMix");
  }
  std::map<std::string, std::string> opts;
  for (const auto &kv : options) opts[Str(kv.first)] = Str(kv.second);
  std::string target;
  auto daemon = opts.find(kDaemonOption);
  std::string source = std::string("the ") + kDaemonOption + " option";
  if (daemon != opts.end()) {
    target = daemon->second;
    opts.erase(daemon);
  } else if (const char *env = std::getenv(kDaemonEnv)) {
    target = env;
    source = kDaemonEnv;
  }
  // C++ option keys -> the ones the daemon reads (the Python client's init, cache-manager mode)
  auto device = opts.find(OPTION_DEVICE_ID);
  if (device == opts.end()) return Fail(kFunc, LLM_PARAM_INVALID, std::string(OPTION_DEVICE_ID) + " is required");
  if (!Digits(device->second)) {
    return Fail(kFunc, LLM_PARAM_INVALID, std::string(OPTION_DEVICE_ID) + " must be one device id, got \"" +
                                              device->second + "\"");
  }
  opts["ge.exec.deviceId"] = device->second;
  // CANN's Initialize makes the device current on the calling thread (its samples aclrtMalloc right after it,
  // without aclrtSetDevice); do the same when this process has the ACL runtime loaded. No link dependency.
  using SetDevice = int (*)(int32_t);
  if (auto set_device = reinterpret_cast<SetDevice>(dlsym(RTLD_DEFAULT, "aclrtSetDevice"))) {
    const int err = set_device(std::stoi(device->second));
    if (err != 0) return Fail(kFunc, LLM_FAILED, "aclrtSetDevice(" + device->second + ") failed: " + std::to_string(err));
  }
  opts.erase(device);
  auto listen = opts.find(OPTION_LISTEN_IP_INFO);
  if (listen != opts.end()) {
    std::string ip, port;
    if (!SplitListen(listen->second, &ip, &port)) {
      return Fail(kFunc, LLM_PARAM_INVALID, std::string(OPTION_LISTEN_IP_INFO) + " must be exactly \"ip:port\", got \"" +
                                                listen->second + "\"");
    }
    opts["llm.listenIpInfo"] = listen->second;
    opts["llm.ListenIp"] = ip;
    opts["llm.ListenPort"] = port;
    opts.erase(listen);
  }
  auto wait = opts.find(OPTION_SYNC_CACHE_WAIT_TIME);
  if (wait != opts.end()) {
    if (!Digits(wait->second) || std::stoi(wait->second) <= 0) {
      return Fail(kFunc, LLM_PARAM_INVALID, std::string(OPTION_SYNC_CACHE_WAIT_TIME) +
                                                " must be a positive number of milliseconds, got \"" + wait->second + "\"");
    }
    sync_timeout_ms_ = std::stoi(wait->second);
  }
  auto backend = opts.find(OPTION_TRANSFER_BACKEND);
  if (backend != opts.end() && backend->second != "hixl") {
    return Fail(kFunc, LLM_PARAM_INVALID, std::string(OPTION_TRANSFER_BACKEND) + " must be \"hixl\", got \"" +
                                              backend->second + "\"");
  }
  opts["llm.EnableCacheManager"] = "1";
  opts["llm.EnableRemoteCacheAccessible"] = "1";
  opts["llm.Role"] = role_ == LlmRole::kPrompt ? "Prompt" : (role_ == LlmRole::kDecoder ? "Decoder" : "Mix");

  if (target.empty()) {
    private_daemon_.reset(new datadist_cpp::PrivateDaemon());
    const Status st = private_daemon_->Start(30000);
    if (st != LLM_SUCCESS) {
      private_daemon_.reset();
      return st;
    }
    target = private_daemon_->target();
    source = "the private daemon";
  }
  const std::string path = UnixPath(target);
  if (path.empty()) {
    Finalize();
    return Fail(kFunc, LLM_PARAM_INVALID, "datadistd serves workers on a unix socket only; got \"" + target +
                                              "\" from " + source +
                                              " (use unix:///run/datadist/datadistd.sock or /run/datadist/datadistd.sock)");
  }
  const std::string absent = NobodyListens(path);
  if (!absent.empty()) {
    Finalize();
    return Fail(kFunc, LLM_FAILED, "no datadistd at " + target + " (from " + source + "): " + absent +
                                       "; start it (systemctl start datadistd), point " + kDaemonEnv +
                                       " at its socket, or unset it to start a private one");
  }
  Status st = attach_.Connect(path + ".attach", 30000);
  if (st != LLM_SUCCESS) {
    Finalize();
    return st;
  }
  channel_ = datadist_cpp::OpenChannel(path);
  stub_ = pb::DataDist::NewStub(channel_);
  pb::InitRequest req;
  req.set_cluster_id(cluster_id_);
  req.set_role(static_cast<pb::Role>(static_cast<int32_t>(role_)));
  for (const auto &kv : opts) (*req.mutable_options())[kv.first] = kv.second;
  const bool npu = attach_.memory_backend() == "acl";
  auto device_opt = req.mutable_options()->find("ge.exec.deviceId");
  if (npu && device_opt != req.mutable_options()->end()) {  // the daemon names NPUs by physical id
    std::string physical;
    st = datadist_cpp::PhysicalNpus(device_opt->second, kFunc, &physical);
    if (st != LLM_SUCCESS) {
      Finalize();
      return st;
    }
    device_opt->second = physical;
  }
  pb::InitResponse resp;
  st = Rpc(&pb::DataDist::Stub::Init, req, &resp, kFunc);
  if (st == LLM_SUCCESS && npu) {  // this process's logical id of the engine's NPU
    st = datadist_cpp::LogicalNpu(static_cast<int32_t>(resp.device_id()), kFunc, &device_id_);
  } else if (st == LLM_SUCCESS) {
    device_id_ = static_cast<int32_t>(resp.device_id());
  }
  if (st != LLM_SUCCESS) {
    Finalize();
    return st;
  }
  engine_id_ = resp.engine_id();
  initialized_ = true;
  Log(LogLevel::kInfo, "initialized: cluster " + std::to_string(cluster_id_) + ", engine " +
                           std::to_string(engine_id_) + " via " + target);
  return LLM_SUCCESS;
}

void LlmDataDist::LlmDataDistImpl::Finalize() {
  if (initialized_) {
    pb::EngineRef req;
    req.set_engine_id(engine_id_);
    pb::Empty resp;
    if (!attach_.broken()) {
      (void)Rpc(&pb::DataDist::Stub::Finalize, req, &resp, "Finalize", 15000);
    }
  }
  initialized_ = false;
  attach_.Close();  // ends the lease: the daemon releases whatever this engine left
  stub_.reset();
  channel_.reset();
  std::vector<datadist_cpp::ExportRange> finalized;  // closed after the daemon's Finalize (or the lease's end)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &kv : pools_) {
      if (!kv.second.device_key.empty()) {
        datadist_cpp::CloseDevicePool(kv.second.device_key, kv.second.device);
        continue;
      }
      if (kv.second.base != nullptr) (void)munmap(kv.second.base, kv.second.size);
      if (kv.second.fd >= 0) (void)close(kv.second.fd);
    }
    pools_.clear();
    caches_.clear();
    for (auto &kv : exports_) finalized.insert(finalized.end(), kv.second.begin(), kv.second.end());
    exports_.clear();
  }
  if (private_daemon_) {
    private_daemon_->Stop();
    private_daemon_.reset();
  }
  datadist_cpp::ReleaseExports(finalized);  // importer first, exporter second
}

Status LlmDataDist::LlmDataDistImpl::SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
  static const char *const kFunc = "SetRole";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  if (role != LlmRole::kPrompt && role != LlmRole::kDecoder && role != LlmRole::kMix) {
    return Fail(kFunc, LLM_PARAM_INVALID, "role must be kPrompt, kDecoder or kMix");
  }
  pb::SwitchRoleRequest req;
  req.set_engine_id(engine_id_);
  req.set_role(static_cast<pb::Role>(static_cast<int32_t>(role)));
  for (const auto &kv : options) {
    const std::string key = Str(kv.first), value = Str(kv.second);
    if (key == OPTION_LISTEN_IP_INFO) {
      std::string ip, port;
      if (!SplitListen(value, &ip, &port)) {
        return Fail(kFunc, LLM_PARAM_INVALID, std::string(OPTION_LISTEN_IP_INFO) + " must be exactly \"ip:port\", got \"" +
                                                  value + "\"");
      }
      (*req.mutable_options())["llm.listenIpInfo"] = value;
      (*req.mutable_options())["llm.ListenIp"] = ip;
      (*req.mutable_options())["llm.ListenPort"] = port;
    } else {
      (*req.mutable_options())[key] = value;
    }
  }
  pb::Empty resp;
  st = Rpc(&pb::DataDist::Stub::SwitchRole, req, &resp, kFunc);
  if (st == LLM_SUCCESS) role_ = role;
  return st;
}

Status LlmDataDist::LlmDataDistImpl::Link(bool unlink, const std::vector<ClusterInfo> &clusters,
                                          std::vector<Status> &rets, int32_t timeout, bool force) {
  const char *func = unlink ? "UnlinkLlmClusters" : "LinkLlmClusters";
  rets.clear();
  Status st = CheckInit(func);
  if (st != LLM_SUCCESS) return st;
  if (timeout <= 0) return Fail(func, LLM_PARAM_INVALID, "timeout_in_millis must be > 0, got " + std::to_string(timeout));
  if (clusters.empty()) return Fail(func, LLM_PARAM_INVALID, "clusters must not be empty");
  if (clusters.size() > kMaxClusters) {
    return Fail(func, LLM_CLUSTER_NUM_EXCEED_LIMIT, std::to_string(clusters.size()) + " clusters; at most 16 per call");
  }
  std::vector<pb::ClusterLink> links;
  for (const ClusterInfo &c : clusters) {
    pb::ClusterLink link;
    link.set_remote_cluster_id(c.remote_cluster_id);
    for (const IpInfo &ip : c.local_ip_infos) {
      auto *m = link.add_local_ip_info();
      m->set_ip(Str(ip.ip));
      m->set_port(ip.port);
    }
    for (const IpInfo &ip : c.remote_ip_infos) {
      auto *m = link.add_remote_ip_info();
      m->set_ip(Str(ip.ip));
      m->set_port(ip.port);
    }
    links.push_back(link);
  }
  pb::LinkClustersResponse resp;
  if (unlink) {
    pb::UnlinkClustersRequest req;
    req.set_engine_id(engine_id_);
    for (auto &l : links) *req.add_clusters() = l;
    req.set_timeout_ms(static_cast<uint32_t>(timeout));
    req.set_force(force);
    st = Rpc(&pb::DataDist::Stub::UnlinkClusters, req, &resp, func, timeout + kRpcMarginMs);
  } else {
    pb::LinkClustersRequest req;
    req.set_engine_id(engine_id_);
    for (auto &l : links) *req.add_clusters() = l;
    req.set_timeout_ms(static_cast<uint32_t>(timeout));
    st = Rpc(&pb::DataDist::Stub::LinkClusters, req, &resp, func, timeout + kRpcMarginMs);
  }
  if (st != LLM_SUCCESS) return st;
  for (int i = 0; i < resp.statuses_size(); ++i) {
    const Status code = datadist_cpp::CodeToStatus(resp.statuses(i));
    rets.push_back(code);
    if (code != LLM_SUCCESS) {
      // a call refused whole sends one reason that stands for every cluster
      const std::string reason =
          resp.reasons_size() == 1 ? resp.reasons(0) : (i < resp.reasons_size() ? resp.reasons(i) : "");
      const std::string which = static_cast<size_t>(i) < clusters.size()
                                    ? std::to_string(clusters[static_cast<size_t>(i)].remote_cluster_id)
                                    : "#" + std::to_string(i);
      Fail(func, code, "cluster " + which + (reason.empty() ? "" : ": " + reason));
    }
  }
  if (!unlink) linked_once_ = true;
  return datadist_cpp::CodeToStatus(resp.status());
}

// ---- memory -----------------------------------------------------------------------------------------------------

Status LlmDataDist::LlmDataDistImpl::HandOver(const char *func, uint64_t addr, uint64_t size, bool npu,
                                              pb::WorkerMemory *mem, std::vector<datadist_cpp::ExportRange> *held) {
  if (npu) {
    uint64_t memory_id = 0U;
    datadist_cpp::ExportRange range;
    const Status st = datadist_cpp::HandOverDeviceMemory(attach_, addr, size, device_id_, func, &memory_id, &range);
    if (st == LLM_SUCCESS) {
      mem->mutable_attached()->set_memory_id(memory_id);
      held->push_back(range);
    }
    return st;
  }
  datadist_cpp::Shared shared;
  std::string why;
  if (!datadist_cpp::Share(addr, size, &shared, &why)) return Fail(func, LLM_PARAM_INVALID, why);
  uint64_t memory_id = 0U;
  const Status st = attach_.ImportMemory(shared.fds, shared.pieces, shared.offset, shared.length, func, &memory_id);
  shared.Close();
  if (st == LLM_SUCCESS) mem->mutable_attached()->set_memory_id(memory_id);
  return st;
}

// The daemon acknowledged that cache `cache_id` is gone: its export keys' users go (importer first).
void LlmDataDist::LlmDataDistImpl::DropExports(int64_t cache_id) {
  std::vector<datadist_cpp::ExportRange> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exports_.find(cache_id);
    if (it == exports_.end()) return;
    held.swap(it->second);
    exports_.erase(it);
  }
  datadist_cpp::ReleaseExports(held);
}

void LlmDataDist::LlmDataDistImpl::ReleaseAttached(const pb::RegisterCacheRequest &req) {
  std::vector<uint64_t> ids;
  for (const auto &t : req.tensors()) {
    if (t.has_attached()) ids.push_back(t.attached().memory_id());
  }
  attach_.ReleaseMemory(ids);
}

static void DescPb(const CacheDesc &desc, pb::CacheDesc *out) {
  out->set_num_tensors(desc.num_tensors);
  for (int64_t d : desc.shape) out->add_shape(d);
  out->set_data_type(static_cast<uint32_t>(desc.data_type));
  out->set_placement(desc.placement == CachePlacement::kHost ? pb::PLACEMENT_HOST : pb::PLACEMENT_DEVICE);
}

static Status CheckDesc(const char *func, const CacheDesc &desc, uint64_t *tensor_size) {
  if (desc.placement != CachePlacement::kHost && desc.placement != CachePlacement::kDevice) {
    return Fail(func, LLM_PARAM_INVALID, "cache_desc.placement must be kHost or kDevice");
  }
  if (desc.num_tensors == 0U) return Fail(func, LLM_PARAM_INVALID, "cache_desc.num_tensors must be > 0");
  const size_t item = ItemSize(desc.data_type);
  if (item == 0U) {
    return Fail(func, LLM_PARAM_INVALID, "cache_desc.data_type " + std::to_string(static_cast<int>(desc.data_type)) +
                                             " is not supported");
  }
  if (desc.shape.empty()) return Fail(func, LLM_PARAM_INVALID, "cache_desc.shape must not be empty");
  unsigned __int128 bytes = item;
  for (int64_t d : desc.shape) {
    if (d <= 0) return Fail(func, LLM_PARAM_INVALID, "cache_desc.shape dims must be > 0");
    bytes *= static_cast<uint64_t>(d);
    if (bytes > (static_cast<unsigned __int128>(1) << 48U)) {
      return Fail(func, LLM_PARAM_INVALID, "cache_desc.shape is too large");
    }
  }
  *tensor_size = static_cast<uint64_t>(bytes);
  return LLM_SUCCESS;
}

Status LlmDataDist::LlmDataDistImpl::Register(const char *func, const CacheDesc &desc,
                                              const std::vector<uint64_t> &addrs, bool is_blocks, int64_t model_id,
                                              int64_t *cache_id) {
  uint64_t size = 0U;
  Status st = CheckDesc(func, desc, &size);
  if (st != LLM_SUCCESS) return st;
  pb::RegisterCacheRequest req;
  req.set_engine_id(engine_id_);
  DescPb(desc, req.mutable_desc());
  req.set_is_blocks(is_blocks);
  if (!linked_once_) req.set_remote_accessible(true);  // CANN's C++ caches are all remotely accessible
  if (is_blocks) {
    req.mutable_blocks_key()->set_cluster_id(cluster_id_);
    req.mutable_blocks_key()->set_model_id(static_cast<uint64_t>(model_id));
  }
  // DEVICE tensors of a daemon keeping them in NPU memory (backend acl) go by ACL IPC; the rest as files
  const bool npu = desc.placement == CachePlacement::kDevice && attach_.memory_backend() == "acl";
  std::vector<datadist_cpp::ExportRange> held;  // given back once the daemon no longer imports them
  for (uint64_t a : addrs) {
    pb::WorkerMemory mem;
    st = HandOver(func, a, size, npu, &mem, &held);
    if (st != LLM_SUCCESS) {
      ReleaseAttached(req);
      datadist_cpp::ReleaseExports(held);
      return st;
    }
    *req.add_tensors() = mem;
    if (!is_blocks) req.add_worker_addrs(a);
  }
  pb::CacheInfo info;
  st = Rpc(&pb::DataDist::Stub::RegisterCache, req, &info, func);
  if (st != LLM_SUCCESS) {
    ReleaseAttached(req);
    datadist_cpp::ReleaseExports(held);
    return st;
  }
  *cache_id = info.cache_id();
  if (!held.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto &mine = exports_[info.cache_id()];
    mine.insert(mine.end(), held.begin(), held.end());
  }
  return LLM_SUCCESS;
}

Status LlmDataDist::LlmDataDistImpl::RegisterKvCache(const CacheDesc &desc, const std::vector<uint64_t> &addrs,
                                                     int64_t &cache_id) {
  static const char *const kFunc = "RegisterKvCache";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  if (addrs.size() != desc.num_tensors) {
    return Fail(kFunc, LLM_PARAM_INVALID, "addrs has " + std::to_string(addrs.size()) + " entries but num_tensors is " +
                                              std::to_string(desc.num_tensors));
  }
  if (addrs.size() > kMaxRegisteredAddrs) {
    return Fail(kFunc, LLM_PARAM_INVALID, "at most 240 addresses per RegisterKvCache");
  }
  for (uint64_t a : addrs) {
    if (a == 0U) return Fail(kFunc, LLM_PARAM_INVALID, "addrs must not contain 0");
  }
  int64_t id = -1, twin = -1;
  st = Register(kFunc, desc, addrs, false, 0, &id);
  if (st != LLM_SUCCESS) return st;
  st = Register(kFunc, desc, addrs, true, id, &twin);
  if (st != LLM_SUCCESS) {
    pb::CacheRef ref;
    ref.set_engine_id(engine_id_);
    ref.set_cache_id(id);
    pb::Empty empty;
    if (Rpc(&pb::DataDist::Stub::UnregisterCache, ref, &empty, kFunc) == LLM_SUCCESS) DropExports(id);
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    CacheRecord rec;
    rec.twin = twin;
    rec.desc = desc;
    caches_[id] = rec;
  }
  cache_id = id;
  return LLM_SUCCESS;
}

Status LlmDataDist::LlmDataDistImpl::UnregisterKvCache(int64_t cache_id) {
  static const char *const kFunc = "UnregisterKvCache";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  CacheRecord rec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = caches_.find(cache_id);
    if (it == caches_.end() || it->second.allocated) return LLM_SUCCESS;  // unknown id: success (CANN)
    rec = it->second;
  }
  pb::Empty empty;
  for (int64_t id : {rec.twin, cache_id}) {
    pb::CacheRef ref;
    ref.set_engine_id(engine_id_);
    ref.set_cache_id(id);
    st = Rpc(&pb::DataDist::Stub::UnregisterCache, ref, &empty, kFunc);
    if (st != LLM_SUCCESS) return st;
    DropExports(id);  // the daemon no longer imports its NPU memory: the export keys may close
  }
  std::lock_guard<std::mutex> lock(mu_);
  caches_.erase(cache_id);
  return LLM_SUCCESS;
}

Status LlmDataDist::LlmDataDistImpl::MapPool(const char *func, const pb::SharedExport &t, uint64_t *addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(t.pool());
  if (it == pools_.end()) {
    int fd = -1;
    uint64_t size = 0U;
    std::string key;
    int32_t physical = -1;
    const int32_t tgid = attach_.memory_backend() == "acl" ? datadist_cpp::BareTgid() : 0;
    Status st = attach_.ExportPool(engine_id_, t.pool(), func, tgid, &fd, &size, &key, &physical);
    if (st != LLM_SUCCESS) return st;
    PoolMap m;
    m.size = size;
    if (!key.empty()) {  // NPU memory (memory backend acl): imported by the key only this process may import
      uint64_t base = 0U;
      st = datadist_cpp::ImportDevicePool(key, physical, func, &base, &m.device);
      if (st != LLM_SUCCESS) return st;
      m.base = reinterpret_cast<void *>(base);
      m.device_key = key;
    } else {
      // mapped only when its size can change no more: a pool that shrinks under the mapping faults (SIGBUS) at the
      // next touch of a page past its new end (the daemon's pools are sealed so: server/datadistd/memory/host.py).
      // The seals before the size: a size read stays true only once it can change no more (the sender may still hold
      // the descriptor, shrink it after a size check and seal it then)
      const int seals = fcntl(fd, F_GET_SEALS);
      if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        (void)close(fd);
        return Fail(func, LLM_FAILED,
                    "the pool descriptor is not sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW; "
                    "seals " + std::to_string(seals) + "): its size could change under the mapping");
      }
      struct stat sb {};
      if (size == 0U || fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < size) {
        (void)close(fd);
        return Fail(func, LLM_FAILED, "the pool descriptor does not hold " + std::to_string(size) + " bytes");
      }
      if (t.file_offset() + t.length() > size || t.file_offset() + t.length() < t.file_offset()) {
        (void)close(fd);
        return Fail(func, LLM_FAILED, "a tensor lies outside its pool");
      }
      void *base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) {
        (void)close(fd);
        return Fail(func, LLM_FAILED, std::string("mmap of the pool failed: ") + std::strerror(errno));
      }
      m.base = base;
      m.fd = fd;  // kept: the blocks twin of an allocated cache hands the same file back
    }
    it = pools_.emplace(t.pool(), m).first;
  }
  if (t.file_offset() + t.length() > it->second.size || t.file_offset() + t.length() < t.file_offset()) {
    return Fail(func, LLM_FAILED, "a tensor lies outside its pool");
  }
  *addr = reinterpret_cast<uint64_t>(it->second.base) + t.file_offset();
  return LLM_SUCCESS;
}

Status LlmDataDist::LlmDataDistImpl::AllocateCache(const CacheDesc &desc, Cache &cache) {
  static const char *const kFunc = "AllocateCache";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  uint64_t size = 0U;
  st = CheckDesc(kFunc, desc, &size);
  if (st != LLM_SUCCESS) return st;
  pb::AllocateCacheRequest req;
  req.set_engine_id(engine_id_);
  DescPb(desc, req.mutable_desc());
  pb::CacheInfo info;
  st = Rpc(&pb::DataDist::Stub::AllocateCache, req, &info, kFunc);
  if (st != LLM_SUCCESS) return st;
  const int64_t id = info.cache_id();
  std::vector<uint64_t> addrs;
  // every tensor checked against the description before its pool is mapped: as many as it has, each `size` bytes
  // (what the blocks twin hands back, and what the caller's views cover) -- inside its pool (MapPool)
  if (static_cast<uint64_t>(info.tensors_size()) != desc.num_tensors) {
    st = Fail(kFunc, LLM_FAILED, "the daemon's answer is refused: " + std::to_string(info.tensors_size()) +
                                     " tensors for a description of " + std::to_string(desc.num_tensors));
  }
  for (int i = 0; st == LLM_SUCCESS && i < info.tensors_size(); ++i) {
    if (info.tensors(i).length() != size) {
      st = Fail(kFunc, LLM_FAILED, "the daemon's answer is refused: tensor " + std::to_string(i) + " is " +
                                       std::to_string(info.tensors(i).length()) +
                                       " bytes where the description makes " + std::to_string(size));
    }
  }
  for (const auto &t : info.tensors()) {
    if (st != LLM_SUCCESS) break;
    uint64_t a = 0U;
    st = MapPool(kFunc, t, &a);
    if (st != LLM_SUCCESS) break;
    addrs.push_back(a);
  }
  if (st == LLM_SUCCESS) {
    pb::WorkerAddrsRequest w;
    w.set_engine_id(engine_id_);
    w.set_cache_id(id);
    for (uint64_t a : addrs) w.add_addrs(a);
    pb::Empty empty;
    st = Rpc(&pb::DataDist::Stub::SetWorkerAddrs, w, &empty, kFunc);
  }
  int64_t twin = -1;
  if (st == LLM_SUCCESS) st = Register(kFunc, desc, addrs, true, id, &twin);
  if (st != LLM_SUCCESS) {
    pb::CacheRef ref;
    ref.set_engine_id(engine_id_);
    ref.set_cache_id(id);
    pb::Empty empty;
    (void)Rpc(&pb::DataDist::Stub::DeallocateCache, ref, &empty, kFunc);
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    CacheRecord rec;
    rec.twin = twin;
    rec.allocated = true;
    rec.desc = desc;
    caches_[id] = rec;
  }
  cache.cache_id = id;
  cache.cache_desc = desc;
  cache.tensor_addrs.assign(addrs.begin(), addrs.end());
  return LLM_SUCCESS;
}

Status LlmDataDist::LlmDataDistImpl::DeallocateCache(int64_t cache_id) {
  static const char *const kFunc = "DeallocateCache";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  CacheRecord rec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = caches_.find(cache_id);
    if (it == caches_.end() || !it->second.allocated) return LLM_SUCCESS;  // unknown or released: success (CANN)
    rec = it->second;
  }
  pb::Empty empty;
  pb::CacheRef twin;
  twin.set_engine_id(engine_id_);
  twin.set_cache_id(rec.twin);
  st = Rpc(&pb::DataDist::Stub::UnregisterCache, twin, &empty, kFunc);
  if (st != LLM_SUCCESS) return st;
  DropExports(rec.twin);
  pb::CacheRef ref;
  ref.set_engine_id(engine_id_);
  ref.set_cache_id(cache_id);
  st = Rpc(&pb::DataDist::Stub::DeallocateCache, ref, &empty, kFunc);
  if (st != LLM_SUCCESS) return st;
  std::lock_guard<std::mutex> lock(mu_);
  caches_.erase(cache_id);
  return LLM_SUCCESS;
}

// ---- transfers --------------------------------------------------------------------------------------------------

Status LlmDataDist::LlmDataDistImpl::Transfer(const char *func, bool push, bool blocks, const CacheIndex &remote,
                                              const Cache &local, const std::vector<uint64_t> &remote_blocks,
                                              const std::vector<uint64_t> &local_blocks, uint32_t local_batch_index,
                                              int64_t size, const KvCacheExtParam &ext) {
  Status st = CheckInit(func);
  if (st != LLM_SUCCESS) return st;
  pb::TransferRequest req;
  req.set_engine_id(engine_id_);
  if (remote.cluster_id == cluster_id_) {
    return Fail(func, LLM_PARAM_INVALID, "the remote cache names this engine's own cluster id " +
                                             std::to_string(cluster_id_));
  }
  if (ext.tensor_num_per_layer == 0U) return Fail(func, LLM_PARAM_INVALID, "tensor_num_per_layer must be > 0");
  bool src_given = false, dst_given = false;
  if (!LayerRange(func, "src_layer_range", ext.src_layer_range, req.mutable_src_layer_range(), &src_given, &st) ||
      !LayerRange(func, "dst_layer_range", ext.dst_layer_range, req.mutable_dst_layer_range(), &dst_given, &st)) {
    return st;
  }
  if (!src_given) req.clear_src_layer_range();
  if (!dst_given) req.clear_dst_layer_range();
  if (src_given && dst_given &&
      ext.src_layer_range.second - ext.src_layer_range.first != ext.dst_layer_range.second - ext.dst_layer_range.first) {
    return Fail(func, LLM_PARAM_INVALID, "src_layer_range and dst_layer_range differ in length");
  }
  req.set_tensor_num_per_layer(ext.tensor_num_per_layer);
  req.set_size(size);
  req.set_local_batch_index(local_batch_index);
  if (!blocks) {
    req.set_kind(pb::TRANSFER_CACHE);
    if (size != -1 && size <= 0) return Fail(func, LLM_PARAM_INVALID, "size must be -1 or > 0, got " + std::to_string(size));
    if (push && size != -1) return Fail(func, LLM_PARAM_INVALID, "PushKvCache supports size = -1 only");
    auto *key = req.mutable_remote()->mutable_by_id();
    key->set_cluster_id(remote.cluster_id);
    key->set_cache_id(remote.cache_id);
    key->set_batch_index(remote.batch_index);
    req.set_local_cache_id(local.cache_id);
  } else {
    req.set_kind(pb::TRANSFER_BLOCKS);
    if (remote.batch_index != 0U) return Fail(func, LLM_PARAM_INVALID, "the CacheIndex of a blocks cache needs batch_index 0");
    if (local_blocks.empty() && !push) return Fail(func, LLM_PARAM_INVALID, "dst_blocks must not be empty");
    if (remote_blocks.empty() && push) return Fail(func, LLM_PARAM_INVALID, "dst_blocks must not be empty");
    int64_t twin = -1;
    if (!Twin(local.cache_id, &twin, nullptr)) {
      // as the daemon answers for an unknown local cache of a transfer
      return Fail(func, LLM_PARAM_INVALID, "local cache " + std::to_string(local.cache_id) + " does not exist");
    }
    req.set_local_cache_id(twin);
    if (!push && remote_blocks.empty()) {
      // a contiguous source into blocks (CANN: src_blocks empty)
      auto *key = req.mutable_remote()->mutable_by_id();
      key->set_cluster_id(remote.cluster_id);
      key->set_cache_id(remote.cache_id);
      key->set_batch_index(0U);
    } else {
      if (remote_blocks.size() != local_blocks.size()) {
        return Fail(func, LLM_PARAM_INVALID, "src_blocks (" + std::to_string(push ? local_blocks.size() : remote_blocks.size()) +
                                                 ") and dst_blocks (" +
                                                 std::to_string(push ? remote_blocks.size() : local_blocks.size()) +
                                                 ") differ in length");
      }
      if (remote.cache_id < 0) return Fail(func, LLM_KV_CACHE_NOT_EXIST, "cache_id must be >= 0");
      auto *key = req.mutable_remote()->mutable_blocks_key();
      key->set_cluster_id(remote.cluster_id);
      key->set_model_id(static_cast<uint64_t>(remote.cache_id));
    }
    for (uint64_t b : remote_blocks) req.add_remote_blocks(b);
    for (uint64_t b : local_blocks) req.add_local_blocks(b);
  }
  // the daemon names a remote blocks cache by its twin's key, one the caller never used: its answers name the
  // CacheIndex the caller passed instead
  const datadist_cpp::FailWording wording(
      req.remote().has_blocks_key() ? "BlocksCacheKey(model_id=" + std::to_string(remote.cache_id) + ")"
                                    : std::string(),
      "CacheIndex(cluster_id=" + std::to_string(remote.cluster_id) + ", cache_id=" +
          std::to_string(remote.cache_id) + ")");
  const int timeout = sync_timeout_ms_ + kRpcMarginMs;
  if (attach_.TryTransfer(push, req, func, timeout, &st)) return st;
  Log(LogLevel::kDebug, std::string(func) + ": " + std::to_string(req.remote_blocks_size() + req.local_blocks_size()) +
                            " block numbers as the gRPC " + (push ? "Push" : "Pull") +
                            " (another thread waits on the attach connection)");
  pb::TransferResponse resp;
  return Rpc(push ? &pb::DataDist::Stub::Push : &pb::DataDist::Stub::Pull, req, &resp, func, timeout);
}

Status LlmDataDist::LlmDataDistImpl::CopyKvCache(const Cache &src, const Cache &dst, uint32_t src_batch,
                                                 uint32_t dst_batch, uint64_t offset, int64_t size) {
  static const char *const kFunc = "CopyKvCache";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  if (size != -1 && size <= 0) return Fail(kFunc, LLM_PARAM_INVALID, "size must be -1 or > 0, got " + std::to_string(size));
  pb::CopyCacheRequest req;
  req.set_engine_id(engine_id_);
  req.set_src_cache_id(src.cache_id);
  req.set_dst_cache_id(dst.cache_id);
  req.set_src_batch_index(src_batch);
  req.set_dst_batch_index(dst_batch);
  req.set_offset(offset);
  req.set_size(size);
  pb::Empty empty;
  return Rpc(&pb::DataDist::Stub::CopyCache, req, &empty, kFunc);
}

Status LlmDataDist::LlmDataDistImpl::CopyKvBlocks(const Cache &src, const Cache &dst,
                                                  const std::vector<uint64_t> &src_blocks,
                                                  const std::vector<std::vector<uint64_t>> &dst_blocks_list) {
  static const char *const kFunc = "CopyKvBlocks";
  Status st = CheckInit(kFunc);
  if (st != LLM_SUCCESS) return st;
  if (src_blocks.empty() || dst_blocks_list.empty()) {
    return Fail(kFunc, LLM_PARAM_INVALID, "src_blocks and dst_blocks_list must not be empty");
  }
  for (const auto &l : dst_blocks_list) {
    if (l.size() != src_blocks.size()) {
      return Fail(kFunc, LLM_PARAM_INVALID, "every list of dst_blocks_list must be as long as src_blocks");
    }
  }
  int64_t src_twin = -1, dst_twin = -1;
  if (!Twin(src.cache_id, &src_twin, nullptr) || !Twin(dst.cache_id, &dst_twin, nullptr)) {
    return Fail(kFunc, LLM_KV_CACHE_NOT_EXIST, "cache " + std::to_string(src.cache_id) + " or " +
                                                   std::to_string(dst.cache_id) + " is not a cache of this LlmDataDist");
  }
  pb::Empty empty;
  if (src.cache_id == dst.cache_id) {
    pb::CopyBlocksRequest req;
    req.set_engine_id(engine_id_);
    req.set_cache_id(src_twin);
    std::map<uint64_t, pb::BlockCopy *> by_src;
    for (size_t i = 0; i < src_blocks.size(); ++i) {
      if (by_src.count(src_blocks[i]) != 0U) return Fail(kFunc, LLM_PARAM_INVALID, "src_blocks has a block twice");
      pb::BlockCopy *c = req.add_copies();
      c->set_src_block(src_blocks[i]);
      for (const auto &l : dst_blocks_list) c->add_dst_blocks(l[i]);
      by_src[src_blocks[i]] = c;
    }
    return Rpc(&pb::DataDist::Stub::CopyBlocks, req, &empty, kFunc);
  }
  if (dst_blocks_list.size() != 1U) {
    return Fail(kFunc, LLM_PARAM_INVALID, "between two caches dst_blocks_list holds one list");
  }
  pb::SwapBlocksRequest req;
  req.set_engine_id(engine_id_);
  req.mutable_src()->set_cache_id(src_twin);
  req.mutable_dst()->set_cache_id(dst_twin);
  for (size_t i = 0; i < src_blocks.size(); ++i) {
    if (req.src_to_dst().count(src_blocks[i]) != 0U) return Fail(kFunc, LLM_PARAM_INVALID, "src_blocks has a block twice");
    (*req.mutable_src_to_dst())[src_blocks[i]] = dst_blocks_list[0][i];
  }
  return Rpc(&pb::DataDist::Stub::SwapBlocks, req, &empty, kFunc);
}

// ---- the public class -------------------------------------------------------------------------------------------

LlmDataDist::LlmDataDist(uint64_t cluster_id, LlmRole role) : impl_(new LlmDataDistImpl(cluster_id, role)) {}
LlmDataDist::~LlmDataDist() = default;

Status LlmDataDist::Initialize(const std::map<AscendString, AscendString> &options) { return impl_->Initialize(options); }
void LlmDataDist::Finalize() { impl_->Finalize(); }
Status LlmDataDist::SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
  return impl_->SetRole(role, options);
}
Status LlmDataDist::LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                    int32_t timeout_in_millis) {
  return impl_->Link(false, clusters, rets, timeout_in_millis, false);
}
Status LlmDataDist::UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                      int32_t timeout_in_millis, bool force_flag) {
  return impl_->Link(true, clusters, rets, timeout_in_millis, force_flag);
}
Status LlmDataDist::AllocateCache(const CacheDesc &cache_desc, Cache &cache) { return impl_->AllocateCache(cache_desc, cache); }
Status LlmDataDist::DeallocateCache(int64_t cache_id) { return impl_->DeallocateCache(cache_id); }
Status LlmDataDist::PullKvCache(const CacheIndex &src_cache_index, const Cache &dst_cache, uint32_t batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  return impl_->Transfer("PullKvCache", false, false, src_cache_index, dst_cache, {}, {}, batch_index, size, ext_param);
}
Status LlmDataDist::PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  return impl_->Transfer("PullKvBlocks", false, true, src_cache_index, dst_cache, src_blocks, dst_blocks, 0U, -1,
                         ext_param);
}
Status LlmDataDist::CopyKvCache(const Cache &src_cache, const Cache &dst_cache, uint32_t src_batch_index,
                                uint32_t dst_batch_index, uint64_t offset, int64_t size) {
  return impl_->CopyKvCache(src_cache, dst_cache, src_batch_index, dst_batch_index, offset, size);
}
Status LlmDataDist::CopyKvBlocks(const Cache &src_cache, const Cache &dst_cache, const std::vector<uint64_t> &src_blocks,
                                 const std::vector<std::vector<uint64_t>> &dst_blocks_list) {
  return impl_->CopyKvBlocks(src_cache, dst_cache, src_blocks, dst_blocks_list);
}
Status LlmDataDist::PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index, uint32_t src_batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  return impl_->Transfer("PushKvCache", true, false, dst_cache_index, src_cache, {}, {}, src_batch_index, size, ext_param);
}
Status LlmDataDist::PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  return impl_->Transfer("PushKvBlocks", true, true, dst_cache_index, src_cache, dst_blocks, src_blocks, 0U, -1,
                         ext_param);
}
Status LlmDataDist::RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs,
                                    const RegisterCfg &cfg, int64_t &cache_id) {
  (void)cfg;
  return impl_->RegisterKvCache(cache_desc, addrs, cache_id);
}
Status LlmDataDist::UnregisterKvCache(int64_t cache_id) { return impl_->UnregisterKvCache(cache_id); }

}  // namespace llm_datadist
