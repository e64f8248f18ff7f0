// hixl::Hixl over datadistd (docs/hixl.md, the contract in proto/datadist/hixl.py): a Hixl is an engine of the
// daemon whose cluster id its engine string names (hixl_wire.h); RegisterMem is a one-tensor contiguous cache over
// the caller's memory (host memory as a shared file, NPU memory by ACL IPC: the same hand-over as RegisterKvCache);
// Connect/Disconnect are LinkClusters/UnlinkClusters; transfers are TransferExtents; notifies SendNotify/GetNotifies.
// Statuses as CANN's hixl_impl.cc / hixl_engine.cc answer them; a daemon's LLMStatusCode maps as hixl.py says.
//
// Threads: the caller's threads make every call (one engine mutex guards registrations and connections); the
// connect pool's workers (GlobalResourceConfig connect_pool.thread_num, default 2) run ConnectAsync/DisconnectAsync
// tasks, one at a time per remote engine; gRPC's callback threads finish async transfers (an atomic status per
// request, no thread per request).
#include "hixl/hixl.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "attach.h"
#include "common.h"
#include "daemon.h"
#include "datadist/v1/datadist.grpc.pb.h"
#include "hixl_wire.h"
#include "npu.h"
#include "private_daemon.h"
#include "share.h"

namespace hixl {
namespace pb = datadist::v1;
namespace wire = datadist_cpp::hixl_wire;
using datadist_cpp::Log;
using datadist_cpp::LogLevel;

namespace {
constexpr int kRpcTimeoutMs = 60000;
constexpr int kRpcMarginMs = 5000;
constexpr int32_t kAutoConnectTimeoutMs = 3000;  // hixl_engine.cc kAutoConnectTimeout
// an async transfer's deadline (HIXL's TransferAsync takes none; the Python client's ASYNC_TIMEOUT_MS): the daemon
// answers TIMEOUT after it, and the call's own deadline is this plus kRpcMarginMs
constexpr int32_t kAsyncTimeoutMs = 30000;
constexpr int64_t kLlmFailed = 0xFFFFFFFFLL;
constexpr int64_t kLlmAlreadyLink = 0x5010B008LL;
constexpr int64_t kLlmNotYetLink = 0x5010B007LL;
constexpr const char kBufferPoolDisabled[] = "0:0";  // hixl_engine.cc BUFFER_POOL_DISABLED
// CANN's adxl spellings HIXL accepts beside its own (include/adxl/adxl_types.h)
constexpr const char kAdxlTrafficClass[] = "adxl.RdmaTrafficClass";
constexpr const char kAdxlServiceLevel[] = "adxl.RdmaServiceLevel";
constexpr const char kAdxlBufferPool[] = "adxl.BufferPool";
constexpr const char kAdxlLocalCommRes[] = "adxl.LocalCommRes";

std::string Str(const AscendString &s) { return std::string(s.GetString(), s.GetLength()); }

// The cluster a remote engine string names, at its address (LinkClusters / UnlinkClusters).
void SetCluster(const wire::Engine &engine, pb::ClusterLink *link) {
  link->set_remote_cluster_id(wire::EngineClusterId(engine));
  auto *ip = link->add_remote_ip_info();
  ip->set_ip(engine.host);
  ip->set_port(engine.port);
}

const char *Name(Status st) {
  switch (st) {
    case SUCCESS: return "SUCCESS";
    case PARAM_INVALID: return "PARAM_INVALID";
    case TIMEOUT: return "TIMEOUT";
    case NOT_CONNECTED: return "NOT_CONNECTED";
    case ALREADY_CONNECTED: return "ALREADY_CONNECTED";
    case NOTIFY_FAILED: return "NOTIFY_FAILED";
    case UNSUPPORTED: return "UNSUPPORTED";
    case RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    default: return "FAILED";
  }
}

// "[hixl] [Func] failed, error code is NAME(value), why" on the library's log; returns st
Status Fail(const char *func, Status st, const std::string &why) {
  Log(st == ALREADY_CONNECTED ? LogLevel::kWarning : LogLevel::kError,
      std::string("[hixl] [") + func + "] failed, error code is " + Name(st) + "(" + std::to_string(st) + "), " + why);
  return st;
}

bool ToUint(const std::string &s, uint64_t *out) {
  if (s.empty() || s.size() > 18) return false;
  uint64_t v = 0U;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10U + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

// ---- GlobalResourceConfig: a JSON object (hixl_options.cc); the connect pool's two fields are read ----------------
class Json {
 public:
  explicit Json(const std::string &text) : s_(text) {}
  // A JSON object: its top-level integer fields in *ints; false with *why otherwise.
  bool TopObject(std::map<std::string, int64_t> *ints, std::string *why) {
    Ws();
    if (!Peek('{')) return Bad("GlobalResourceConfig must be a JSON object", why);
    if (!Object(0, ints)) return Bad("GlobalResourceConfig is not valid JSON (at byte " + std::to_string(i_) + ")", why);
    Ws();
    if (i_ != s_.size()) return Bad("GlobalResourceConfig has text after its JSON object", why);
    return true;
  }

 private:
  static bool Bad(const std::string &what, std::string *why) {
    *why = what;
    return false;
  }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool Eat(char c) {
    Ws();
    if (!Peek(c)) return false;
    ++i_;
    return true;
  }
  bool String(std::string *out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;
      if (i_ < s_.size()) out->push_back(s_[i_++]);
    }
    return Eat('"');
  }
  bool Word(const char *w) {
    const size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool Value(int depth, int64_t *integer, bool *is_integer) {
    Ws();
    *is_integer = false;
    if (depth > 64 || i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') return Object(depth + 1, nullptr);
    if (c == '[') {
      ++i_;
      if (Eat(']')) return true;
      do {
        int64_t ignored = 0;
        bool b = false;
        if (!Value(depth + 1, &ignored, &b)) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      std::string ignored;
      return String(&ignored);
    }
    if (Word("true") || Word("false") || Word("null")) return true;
    const size_t start = i_;
    if (Peek('-')) ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == 'e' ||
                              s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      ++i_;
    }
    const std::string num = s_.substr(start, i_ - start);
    if (num.empty() || num == "-") return false;
    char *end = nullptr;
    const double d = std::strtod(num.c_str(), &end);
    if (end == nullptr || *end != '\0') return false;
    *integer = static_cast<int64_t>(d);
    *is_integer = true;
    return true;
  }
  bool Object(int depth, std::map<std::string, int64_t> *ints) {
    if (!Eat('{')) return false;
    if (Eat('}')) return true;
    do {
      std::string key;
      if (!String(&key) || !Eat(':')) return false;
      int64_t v = 0;
      bool is_integer = false;
      if (!Value(depth, &v, &is_integer)) return false;
      if (ints != nullptr && is_integer) (*ints)[key] = v;
    } while (Eat(','));
    return Eat('}');
  }

  const std::string &s_;
  size_t i_ = 0U;
};

// One TransferAsync in flight: finished once, by gRPC's callback thread.
struct AsyncTransfer {
  grpc::ClientContext ctx;
  pb::ExtentTransferRequest request;
  pb::TransferResponse response;
  std::atomic<int> status{static_cast<int>(TransferStatus::WAITING)};
  const void *user_data = nullptr;
  std::string remote;
};

// The options HIXL's engine takes (hixl_engine.cc kSupportedOptions) and datadist's own: which daemon.
// EnableUseFabricMem is the engine factory's: its value is checked, then refused as HixlEngine refuses an option it
// does not support (there is no fabric memory here), as the Python client does.
bool Supported(const std::string &key) {
  static const char *const kKeys[] = {OPTION_RDMA_TRAFFIC_CLASS, kAdxlTrafficClass, OPTION_RDMA_SERVICE_LEVEL,
                                      kAdxlServiceLevel, OPTION_LOCAL_COMM_RES, kAdxlLocalCommRes, OPTION_BUFFER_POOL,
                                      kAdxlBufferPool, OPTION_AUTO_CONNECT, OPTION_GLOBAL_RESOURCE_CONFIG,
                                      datadist_cpp::kDaemonOption};
  for (const char *k : kKeys) {
    if (key == k) return true;
  }
  return false;
}
}  // namespace

// ---- the connect pool (connect_pool_executor.cc's rules) ------------------------------------------------------------
class ConnectPool {
 public:
  ~ConnectPool() { Shutdown(); }

  void Start(int32_t threads, int32_t capacity) {
    capacity_ = capacity;
    running_ = true;
    for (int32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!running_) return;
      running_ = false;
      queue_.clear();
    }
    cv_.notify_all();
    for (auto &w : workers_) w.join();
    workers_.clear();
  }

  Status Submit(std::function<void()> task, const AscendString &remote, bool connect) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return FAILED;
    if (queue_.size() >= static_cast<size_t>(capacity_)) return RESOURCE_EXHAUSTED;
    SetStatus(remote, connect ? AsyncConnectStatus::CONNECT_PENDING : AsyncConnectStatus::DISCONNECT_PENDING);
    queue_.push_back(Task{connect, remote, std::move(task)});
    cv_.notify_one();
    return SUCCESS;
  }

  // the latest of the caller's requests wins: a connect's progress does not overwrite a disconnect queued after it,
  // nor a disconnect's a connect queued after it
  void SetStatus(const AscendString &remote, AsyncConnectStatus status) {
    std::lock_guard<std::mutex> lock(status_mu_);
    auto it = statuses_.find(remote);
    const bool connecting = status == AsyncConnectStatus::CONNECTING || status == AsyncConnectStatus::CONNECTED ||
                            status == AsyncConnectStatus::CONNECT_FAILED;
    const bool disconnecting = status == AsyncConnectStatus::DISCONNECTING || status == AsyncConnectStatus::NOT_CONNECT;
    if (it != statuses_.end() && connecting && it->second == AsyncConnectStatus::DISCONNECT_PENDING) return;
    if (it != statuses_.end() && disconnecting && it->second == AsyncConnectStatus::CONNECT_PENDING) return;
    if (status == AsyncConnectStatus::NOT_CONNECT) {
      statuses_.erase(remote);
    } else {
      statuses_[remote] = status;
    }
  }

  AsyncConnectStatus Get(const AscendString &remote) const {
    std::lock_guard<std::mutex> lock(status_mu_);
    auto it = statuses_.find(remote);
    return it == statuses_.end() ? AsyncConnectStatus::NOT_CONNECT : it->second;
  }

  std::map<AscendString, AsyncConnectStatus> All() const {
    std::lock_guard<std::mutex> lock(status_mu_);
    return statuses_;
  }

 private:
  struct Task {
    bool connect;
    AscendString remote;
    std::function<void()> run;
  };

  void Work() {
    while (true) {
      Task task{false, AscendString(), nullptr};
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] {
          if (!running_) return true;
          for (const Task &t : queue_) {
            if (doing_.count(t.remote) == 0U) return true;
          }
          return false;
        });
        if (!running_) return;
        for (auto it = queue_.begin(); it != queue_.end(); ++it) {  // one task per remote engine at a time
          if (doing_.count(it->remote) == 0U) {
            doing_.insert(it->remote);
            SetStatus(it->remote, it->connect ? AsyncConnectStatus::CONNECTING : AsyncConnectStatus::DISCONNECTING);
            task = std::move(*it);
            queue_.erase(it);
            break;
          }
        }
      }
      if (task.run) {
        task.run();
        std::lock_guard<std::mutex> lock(mu_);
        doing_.erase(task.remote);
        cv_.notify_all();
      }
    }
  }

  int32_t capacity_ = 0;
  bool running_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Task> queue_;
  std::set<AscendString> doing_;
  std::vector<std::thread> workers_;
  mutable std::mutex status_mu_;
  std::map<AscendString, AsyncConnectStatus> statuses_;
};

class Hixl::HixlImpl {
 public:
  ~HixlImpl() { Finalize(); }

  Status Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options);
  void Finalize();
  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle);
  Status DeregisterMem(MemHandle mem_handle);
  Status Connect(const char *func, const AscendString &remote, int32_t timeout_ms);
  Status Disconnect(const char *func, const AscendString &remote, int32_t timeout_ms);
  Status ConnectAsync(const AscendString &remote, int32_t timeout_ms, bool connect);
  Status GetAsyncConnectStatus(const AscendString &remote, AsyncConnectStatus &status) const {
    status = pool_.Get(remote);
    return SUCCESS;
  }
  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses) const {
    statuses = pool_.All();
    return SUCCESS;
  }
  Status TransferSync(const AscendString &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                      int32_t timeout_ms);
  Status TransferAsync(const AscendString &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                       const TransferArgs &args, TransferReq &req);
  Status GetTransferStatus(const TransferReq &req, TransferStatus &status);
  Status GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results);
  Status SendNotify(const AscendString &remote, const NotifyDesc &notify, int32_t timeout_ms);
  Status GetNotifies(std::vector<NotifyDesc> &notifies);

 private:
  struct Registration {
    int64_t cache_id = -1;
    uintptr_t addr = 0U;
    size_t len = 0U;
    MemType type = MEM_HOST;
    std::vector<datadist_cpp::ExportRange> exports;
  };

  // One unary call: SUCCESS, else the daemon's LLMStatusCode in *code (mapped by the caller), logged as `func`.
  template <typename Req, typename Resp>
  Status Call(grpc::Status (pb::DataDist::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
              const Req &req, Resp *resp, const char *func, int timeout_ms, int64_t *code = nullptr);
  Status ParseRemote(const char *func, const AscendString &remote, wire::Engine *engine, bool need_port) const;
  Status Extents(const char *func, const AscendString &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                 int32_t connect_timeout_ms, pb::ExtentTransferRequest *req);
  Status Ready(const char *func, const AscendString &remote, int32_t timeout_ms);
  void AfterFailure(const AscendString &remote, Status st);
  void ForgetRequests(const std::string &remote);
  Status Registered(const MemDesc &mem, MemType type, MemHandle *handle);
  bool Connected(const std::string &remote) {
    std::lock_guard<std::mutex> lock(mu_);
    return connected_.count(remote) != 0U;
  }

  bool initialized_ = false;
  std::string local_text_;
  wire::Engine local_;
  uint64_t cluster_id_ = 0U;
  bool auto_connect_ = false;
  uint64_t engine_id_ = 0U;
  int32_t device_id_ = 0;
  bool npu_ = false;
  std::unique_ptr<datadist_cpp::PrivateDaemon> private_daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::DataDist::Stub> stub_;
  datadist_cpp::AttachClient attach_;
  ConnectPool pool_;

  std::mutex mu_;  // registrations_, next_handle_, connected_, linked_once_
  std::map<uintptr_t, Registration> registrations_;
  uintptr_t next_handle_ = 1U;
  std::set<std::string> connected_;  // remote engines as the caller spelled them
  bool linked_once_ = false;

  std::mutex async_mu_;  // transfers_, order_, in_flight_
  std::condition_variable async_cv_;
  std::map<uint64_t, std::shared_ptr<AsyncTransfer>> transfers_;  // by submission order
  std::map<const void *, uint64_t> order_;
  uint64_t next_seq_ = 1U;
  size_t in_flight_ = 0U;  // callbacks not yet run
};

template <typename Req, typename Resp>
Status Hixl::HixlImpl::Call(grpc::Status (pb::DataDist::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
                            const Req &req, Resp *resp, const char *func, int timeout_ms, int64_t *code) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  ctx.AddMetadata(datadist_cpp::kCapabilityKey, attach_.capability_hex());
  const grpc::Status st = (stub_.get()->*method)(&ctx, req, resp);
  if (st.ok()) return SUCCESS;
  std::string why;
  const int64_t llm = datadist_cpp::FailedCallCode(ctx, st, &why);
  if (code != nullptr) *code = llm;
  return Fail(func, wire::HixlStatus(llm), why);
}

Status Hixl::HixlImpl::ParseRemote(const char *func, const AscendString &remote, wire::Engine *engine,
                                   bool need_port) const {
  std::string why;
  if (!wire::ParseEngine(Str(remote), engine, &why)) return Fail(func, PARAM_INVALID, "remote " + why);
  if (need_port && engine->port == 0U) {
    return Fail(func, PARAM_INVALID, "remote engine '" + Str(remote) +
                                         "' has no port: only an engine with a port listens (\"ip:port\")");
  }
  if (Str(remote) == local_text_ || engine->Canonical() == local_.Canonical()) {
    return Fail(func, PARAM_INVALID, "a connection with self is not supported (local and remote engine " +
                                         local_text_ + ")");
  }
  return SUCCESS;
}

// ---- life cycle -------------------------------------------------------------------------------------------------

Status Hixl::HixlImpl::Initialize(const AscendString &local_engine,
                                  const std::map<AscendString, AscendString> &options) {
  static const char *const kFunc = "Initialize";
  if (initialized_) return SUCCESS;  // hixl_impl.cc: already initialized
  local_text_ = Str(local_engine);
  std::string why;
  if (!wire::ParseEngine(local_text_, &local_, &why)) return Fail(kFunc, PARAM_INVALID, "local " + why);
  cluster_id_ = wire::EngineClusterId(local_);
  std::map<std::string, std::string> opts;
  for (const auto &kv : options) opts[Str(kv.first)] = Str(kv.second);
  auto get = [&opts](const char *a, const char *b) {
    auto it = opts.find(a);
    if (it == opts.end() && b != nullptr) it = opts.find(b);
    return it == opts.end() ? std::string() : it->second;
  };
  // hixl_options.cc's checks (values that have no meaning over datadistd are checked, then ignored: docs/hixl.md)
  std::string tc = get(OPTION_RDMA_TRAFFIC_CLASS, kAdxlTrafficClass);
  if (tc.empty() && std::getenv("HCCL_RDMA_TC") != nullptr) tc = std::getenv("HCCL_RDMA_TC");
  uint64_t n = 0U;
  if (!tc.empty() && (!ToUint(tc, &n) || n > 255U || n % 4U != 0U)) {
    return Fail(kFunc, PARAM_INVALID, "Traffic class is invalid, value = " + tc +
                                          ", must be between 0-255 and a multiple of 4");
  }
  std::string sl = get(OPTION_RDMA_SERVICE_LEVEL, kAdxlServiceLevel);
  if (sl.empty() && std::getenv("HCCL_RDMA_SL") != nullptr) sl = std::getenv("HCCL_RDMA_SL");
  if (!sl.empty() && (!ToUint(sl, &n) || n > 7U)) {
    return Fail(kFunc, PARAM_INVALID, "service_level must be in [0, 7], value = " + sl);
  }
  const std::string fabric = get(OPTION_ENABLE_USE_FABRIC_MEM, nullptr);
  if (!fabric.empty() && (!ToUint(fabric, &n) || n > 1U)) {
    return Fail(kFunc, PARAM_INVALID, std::string(OPTION_ENABLE_USE_FABRIC_MEM) + " is invalid, should be zero or one.");
  }
  if (opts.count(OPTION_AUTO_CONNECT) != 0U) {
    const std::string ac = opts[OPTION_AUTO_CONNECT];
    if (ac.empty() || !ToUint(ac, &n) || n > 1U) {
      return Fail(kFunc, PARAM_INVALID, std::string(OPTION_AUTO_CONNECT) + " is invalid, should be zero or one.");
    }
    auto_connect_ = n == 1U;
  }
  for (const auto &kv : opts) {  // hixl_engine.cc CheckSupportedOptions
    if (!Supported(kv.first)) return Fail(kFunc, PARAM_INVALID, "Unsupported option '" + kv.first + "' for this engine");
  }
  for (const char *key : {OPTION_BUFFER_POOL, kAdxlBufferPool}) {
    if (opts.count(key) != 0U && opts[key] != kBufferPoolDisabled) {
      return Fail(kFunc, PARAM_INVALID, std::string("Invalid option fields, OPTION_BUFFER_POOL for hixl engine only "
                                                    "supports ") + kBufferPoolDisabled);
    }
    if (opts.count(key) != 0U) break;
  }
  int32_t threads = 2, capacity = 128;  // connect_pool_executor.cc defaults
  const std::string grc = get(OPTION_GLOBAL_RESOURCE_CONFIG, nullptr);
  if (!grc.empty()) {
    std::map<std::string, int64_t> ints;
    Json json(grc);
    if (!json.TopObject(&ints, &why)) return Fail(kFunc, PARAM_INVALID, why);
    auto it = ints.find("connect_pool.thread_num");
    if (it != ints.end()) {
      if (it->second < 1 || it->second > 64) {
        return Fail(kFunc, PARAM_INVALID, "connect_pool.thread_num must be in [1, 64], got " + std::to_string(it->second));
      }
      threads = static_cast<int32_t>(it->second);
    }
    it = ints.find("connect_pool.task_queue_capacity");
    if (it != ints.end()) {
      if (it->second < 1 || it->second > 65535) {
        return Fail(kFunc, PARAM_INVALID, "connect_pool.task_queue_capacity must be in [1, 65535], got " +
                                              std::to_string(it->second));
      }
      capacity = static_cast<int32_t>(it->second);
    }
  }

  // the daemon: the datadist.daemon option, else DATADIST_DAEMON, else a private one (as llm_datadist)
  std::string target = get(datadist_cpp::kDaemonOption, nullptr);
  std::string source = std::string("the ") + datadist_cpp::kDaemonOption + " option";
  if (target.empty() && std::getenv(datadist_cpp::kDaemonEnv) != nullptr) {
    target = std::getenv(datadist_cpp::kDaemonEnv);
    source = datadist_cpp::kDaemonEnv;
  }
  if (target.empty()) {
    private_daemon_.reset(new datadist_cpp::PrivateDaemon());
    if (private_daemon_->Start(30000) != 0U) {
      private_daemon_.reset();
      return Fail(kFunc, FAILED, "no daemon: neither the datadist.daemon option nor DATADIST_DAEMON, and the private "
                                 "datadistd did not start (the log above says why)");
    }
    target = private_daemon_->target();
    source = "the private daemon";
  }
  const std::string path = datadist_cpp::UnixPath(target);
  if (path.empty()) {
    Finalize();
    return Fail(kFunc, PARAM_INVALID, "datadistd serves workers on a unix socket only; got \"" + target + "\" from " +
                                          source);
  }
  const std::string absent = datadist_cpp::NobodyListens(path);
  if (!absent.empty()) {
    Finalize();
    return Fail(kFunc, FAILED, "no datadistd at " + target + " (from " + source + "): " + absent);
  }
  if (attach_.Connect(path + ".attach", 30000) != 0U) {
    Finalize();
    return Fail(kFunc, FAILED, "the daemon's attach socket did not answer (the log above says why)");
  }
  channel_ = datadist_cpp::OpenChannel(path);
  stub_ = pb::DataDist::NewStub(channel_);
  npu_ = attach_.memory_backend() == "acl";

  pb::InitRequest req;
  req.set_cluster_id(cluster_id_);
  req.set_role(pb::ROLE_MIX);
  auto &o = *req.mutable_options();
  o["llm.EnableCacheManager"] = "1";
  o["llm.EnableRemoteCacheAccessible"] = "1";
  if (local_.port != 0U) {  // HIXL's server end: the engine listens
    const std::string host = local_.host.find(':') != std::string::npos ? "[" + local_.host + "]" : local_.host;
    o["llm.listenIpInfo"] = host + ":" + std::to_string(local_.port);
    o["llm.ListenIp"] = local_.host;
    o["llm.ListenPort"] = std::to_string(local_.port);
  }
  // the engine's NPU: the calling thread's current ACL device when the process has the runtime (CANN's samples
  // aclrtSetDevice before Initialize); the daemon names NPUs by physical id
  using GetDevice = int (*)(int32_t *);
  int32_t current = -1;
  if (auto get_device = reinterpret_cast<GetDevice>(dlsym(RTLD_DEFAULT, "aclrtGetDevice"))) {
    if (get_device(&current) != 0) current = -1;
  }
  if (current >= 0) {
    std::string device = std::to_string(current);
    if (npu_ && datadist_cpp::PhysicalNpus(device, kFunc, &device) != 0U) {
      Finalize();
      return Fail(kFunc, FAILED, "the physical id of NPU " + std::to_string(current) + " is unknown");
    }
    o["ge.exec.deviceId"] = device;
  } else if (npu_) {
    Finalize();
    return Fail(kFunc, FAILED, "the daemon keeps NPU memory (acl backend) but this thread has no current NPU: "
                               "aclrtSetDevice before Initialize");
  }
  pb::InitResponse resp;
  Status st = Call(&pb::DataDist::Stub::Init, req, &resp, kFunc, kRpcTimeoutMs);
  if (st == SUCCESS && npu_) {
    if (datadist_cpp::LogicalNpu(static_cast<int32_t>(resp.device_id()), kFunc, &device_id_) != 0U) st = FAILED;
  } else if (st == SUCCESS) {
    device_id_ = static_cast<int32_t>(resp.device_id());
  }
  if (st != SUCCESS) {
    Finalize();
    return st;
  }
  engine_id_ = resp.engine_id();
  pool_.Start(threads, capacity);
  initialized_ = true;
  Log(LogLevel::kInfo, "[hixl] initialized " + local_.Canonical() + ": cluster " + std::to_string(cluster_id_) +
                           ", engine " + std::to_string(engine_id_) + " via " + target);
  return SUCCESS;
}

void Hixl::HixlImpl::Finalize() {
  pool_.Shutdown();
  {  // async transfers still in flight are cancelled; their callbacks run before the channel goes
    std::unique_lock<std::mutex> lock(async_mu_);
    for (auto &kv : transfers_) {
      if (kv.second->status.load() == static_cast<int>(TransferStatus::WAITING)) kv.second->ctx.TryCancel();
    }
    async_cv_.wait(lock, [this] { return in_flight_ == 0U; });
    transfers_.clear();
    order_.clear();
  }
  if (initialized_ && !attach_.broken()) {
    pb::EngineRef req;
    req.set_engine_id(engine_id_);
    pb::Empty resp;
    (void)Call(&pb::DataDist::Stub::Finalize, req, &resp, "Finalize", 15000);
  }
  initialized_ = false;
  attach_.Close();  // ends the lease: the daemon releases whatever this engine left
  stub_.reset();
  channel_.reset();
  std::vector<datadist_cpp::ExportRange> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &kv : registrations_) held.insert(held.end(), kv.second.exports.begin(), kv.second.exports.end());
    registrations_.clear();
    connected_.clear();
  }
  if (private_daemon_) {
    private_daemon_->Stop();
    private_daemon_.reset();
  }
  datadist_cpp::ReleaseExports(held);  // importer first, exporter second
}

// ---- memory -----------------------------------------------------------------------------------------------------

Status Hixl::HixlImpl::RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
  static const char *const kFunc = "RegisterMem";
  if (mem.addr == 0U) return Fail(kFunc, PARAM_INVALID, "mem.addr can not be null");
  if (mem.len == 0U) return Fail(kFunc, PARAM_INVALID, "mem.len can not be 0");
  if (type != MEM_DEVICE && type != MEM_HOST) return Fail(kFunc, PARAM_INVALID, "type must be MEM_DEVICE or MEM_HOST");
  if (mem.addr + mem.len < mem.addr) return Fail(kFunc, PARAM_INVALID, "the range overflows the address space");
  Status known = Registered(mem, type, &mem_handle);
  if (known != NOT_CONNECTED) return known;  // its handle, or an overlap refused
  pb::RegisterCacheRequest req;
  req.set_engine_id(engine_id_);
  auto *desc = req.mutable_desc();
  desc->set_num_tensors(1U);
  desc->add_shape(1);  // one row of len bytes: the daemon publishes a cache by rows (a row per byte would be len rows)
  desc->add_shape(static_cast<int64_t>(mem.len));
  desc->set_data_type(4U);  // DT_UINT8
  desc->set_placement(type == MEM_DEVICE ? pb::PLACEMENT_DEVICE : pb::PLACEMENT_HOST);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!linked_once_) req.set_remote_accessible(true);  // the daemon refuses it after the engine's first link
  }
  req.add_worker_addrs(mem.addr);
  Registration reg;
  reg.addr = mem.addr;
  reg.len = mem.len;
  reg.type = type;
  pb::WorkerMemory *tensor = req.add_tensors();
  uint64_t memory_id = 0U;
  if (type == MEM_DEVICE && npu_) {  // NPU memory: ACL IPC, as RegisterKvCache's DEVICE caches on an acl daemon
    datadist_cpp::ExportRange range;
    if (datadist_cpp::HandOverDeviceMemory(attach_, mem.addr, mem.len, device_id_, kFunc, &memory_id, &range) != 0U) {
      return Fail(kFunc, PARAM_INVALID, "the NPU memory could not be handed to the daemon (the log above says why)");
    }
    reg.exports.push_back(range);
  } else {  // host memory (MEM_DEVICE too on a host daemon, where DEVICE is host RAM): as a shared file
    datadist_cpp::Shared shared;
    std::string why;
    if (!datadist_cpp::Share(mem.addr, mem.len, &shared, &why)) return Fail(kFunc, PARAM_INVALID, why);
    const Status imported = attach_.ImportMemory(shared.fds, shared.pieces, shared.offset, shared.length, kFunc,
                                                 &memory_id);
    shared.Close();
    if (imported != 0U) return Fail(kFunc, FAILED, "the daemon did not take the memory (the log above says why)");
  }
  tensor->mutable_attached()->set_memory_id(memory_id);
  pb::CacheInfo info;
  const Status st = Call(&pb::DataDist::Stub::RegisterCache, req, &info, kFunc, kRpcTimeoutMs);
  if (st != SUCCESS) {
    attach_.ReleaseMemory({memory_id});
    datadist_cpp::ReleaseExports(reg.exports);
    return st;
  }
  reg.cache_id = info.cache_id();
  std::lock_guard<std::mutex> lock(mu_);
  const uintptr_t handle = next_handle_++;
  registrations_[handle] = reg;
  mem_handle = reinterpret_cast<MemHandle>(handle);
  return SUCCESS;
}

// hixl_server.cc (as the Python client): the same range of the same type registered already gives its handle
// (SUCCESS); one overlapping a registration of the same type is PARAM_INVALID; NOT_CONNECTED: not registered yet
Status Hixl::HixlImpl::Registered(const MemDesc &mem, MemType type, MemHandle *handle) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto &kv : registrations_) {
    const Registration &r = kv.second;
    if (r.type != type || r.addr >= mem.addr + mem.len || mem.addr >= r.addr + r.len) continue;
    if (r.addr == mem.addr && r.len == mem.len) {
      *handle = reinterpret_cast<MemHandle>(kv.first);
      return SUCCESS;
    }
    return Fail("RegisterMem", PARAM_INVALID, "the range overlaps a registered one (" + std::to_string(r.len) +
                                                  " bytes at " + std::to_string(r.addr) + ")");
  }
  return NOT_CONNECTED;
}

Status Hixl::HixlImpl::DeregisterMem(MemHandle mem_handle) {
  static const char *const kFunc = "DeregisterMem";
  if (mem_handle == nullptr) return Fail(kFunc, PARAM_INVALID, "mem_handle can not be null");
  Registration reg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = registrations_.find(reinterpret_cast<uintptr_t>(mem_handle));
    if (it == registrations_.end()) {  // hixl_engine.cc: a handle not registered is a warning, SUCCESS
      Log(LogLevel::kWarning, "[hixl] [DeregisterMem] handle " + std::to_string(reinterpret_cast<uintptr_t>(mem_handle)) +
                                  " is not registered");
      return SUCCESS;
    }
    if (!connected_.empty()) {
      return Fail(kFunc, FAILED, "all connections (" + *connected_.begin() + (connected_.size() > 1 ? ", ..." : "") +
                                     ") must be disconnected before deregistration");
    }
    reg = it->second;
  }
  pb::CacheRef ref;
  ref.set_engine_id(engine_id_);
  ref.set_cache_id(reg.cache_id);
  pb::Empty empty;
  const Status st = Call(&pb::DataDist::Stub::UnregisterCache, ref, &empty, kFunc, kRpcTimeoutMs);
  if (st != SUCCESS) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registrations_.erase(reinterpret_cast<uintptr_t>(mem_handle));
  }
  datadist_cpp::ReleaseExports(reg.exports);  // the daemon no longer imports it
  return SUCCESS;
}

// ---- connections ------------------------------------------------------------------------------------------------

Status Hixl::HixlImpl::Connect(const char *func, const AscendString &remote, int32_t timeout_ms) {
  wire::Engine engine;
  Status st = ParseRemote(func, remote, &engine, true);
  if (st != SUCCESS) return st;
  if (Connected(Str(remote))) {  // hixl_engine.cc Connect: a client for it exists
    return Fail(func, ALREADY_CONNECTED, "remote engine " + Str(remote) + " is connected already");
  }
  pb::LinkClustersRequest req;
  req.set_engine_id(engine_id_);
  req.set_timeout_ms(static_cast<uint32_t>(timeout_ms));
  SetCluster(engine, req.add_clusters());
  pb::LinkClustersResponse resp;
  st = Call(&pb::DataDist::Stub::LinkClusters, req, &resp, func, timeout_ms + kRpcMarginMs);
  if (st != SUCCESS) return st;
  const int64_t code = resp.statuses_size() > 0 ? resp.statuses(0) : resp.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    linked_once_ = true;
    if (code == 0 || code == kLlmAlreadyLink) connected_.insert(Str(remote));
  }
  if (code == 0) return SUCCESS;
  const std::string reason = resp.reasons_size() > 0 ? resp.reasons(0) : "";
  return Fail(func, wire::HixlStatus(code), "remote engine " + Str(remote) + (reason.empty() ? "" : ": " + reason));
}

// client_manager.cc DestroyClient (as the Python client): not connected by this engine -- a link the remote engine
// made does not count -- is NOT_CONNECTED with no daemon call; otherwise the async requests to it are forgotten
// (their calls cancelled) and the link ended; a link the daemon no longer has is ended already.
Status Hixl::HixlImpl::Disconnect(const char *func, const AscendString &remote, int32_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (connected_.erase(Str(remote)) == 0U) return Fail(func, NOT_CONNECTED, "remote engine " + Str(remote) +
                                                                               " is not connected");
  }
  ForgetRequests(Str(remote));
  wire::Engine engine;
  Status st = ParseRemote(func, remote, &engine, true);
  if (st != SUCCESS) return st;
  pb::UnlinkClustersRequest req;
  req.set_engine_id(engine_id_);
  req.set_timeout_ms(static_cast<uint32_t>(timeout_ms));
  SetCluster(engine, req.add_clusters());
  pb::LinkClustersResponse resp;
  st = Call(&pb::DataDist::Stub::UnlinkClusters, req, &resp, func, timeout_ms + kRpcMarginMs);
  if (st != SUCCESS) return st == NOT_CONNECTED ? SUCCESS : st;
  const int64_t code = resp.statuses_size() > 0 ? resp.statuses(0) : resp.status();
  if (code == 0 || code == kLlmNotYetLink) return SUCCESS;
  const std::string reason = resp.reasons_size() > 0 ? resp.reasons(0) : "";
  return Fail(func, wire::HixlStatus(code), "remote engine " + Str(remote) + (reason.empty() ? "" : ": " + reason));
}

Status Hixl::HixlImpl::ConnectAsync(const AscendString &remote, int32_t timeout_ms, bool connect) {
  if (connect) {
    return pool_.Submit([this, remote, timeout_ms] {
      const Status st = Connect("ConnectAsync", remote, timeout_ms);
      pool_.SetStatus(remote, st == SUCCESS || st == ALREADY_CONNECTED ? AsyncConnectStatus::CONNECTED
                                                                       : AsyncConnectStatus::CONNECT_FAILED);
    }, remote, true);
  }
  return pool_.Submit([this, remote, timeout_ms] {
    (void)Disconnect("DisconnectAsync", remote, timeout_ms);
    pool_.SetStatus(remote, AsyncConnectStatus::NOT_CONNECT);
  }, remote, false);
}

// hixl_engine.cc AutoConnect (as the Python client): a transfer goes over this engine's own connection -- a link the
// remote engine made does not count -- so without one it is NOT_CONNECTED, unless AutoConnect connects first
Status Hixl::HixlImpl::Ready(const char *func, const AscendString &remote, int32_t timeout_ms) {
  if (Connected(Str(remote))) return SUCCESS;
  if (!auto_connect_) return Fail(func, NOT_CONNECTED, "remote engine " + Str(remote) + " is not connected");
  const Status st = Connect(func, remote, timeout_ms);
  return st == ALREADY_CONNECTED ? SUCCESS : st;
}

// After a failed transfer: a link the daemon no longer has is no connection; with AutoConnect the connection is
// ended (hixl_engine.cc AutoDisconnect), so the next transfer connects again
void Hixl::HixlImpl::AfterFailure(const AscendString &remote, Status st) {
  if (st == NOT_CONNECTED) {
    std::lock_guard<std::mutex> lock(mu_);
    connected_.erase(Str(remote));
  } else if (auto_connect_ && Connected(Str(remote))) {
    (void)Disconnect("AutoDisconnect", remote, kAutoConnectTimeoutMs);
  }
}

// The async requests to `remote` are forgotten, their calls cancelled (hixl_engine.cc EraseReqIndexByClient)
void Hixl::HixlImpl::ForgetRequests(const std::string &remote) {
  std::lock_guard<std::mutex> lock(async_mu_);
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    if (it->second->remote != remote) {
      ++it;
      continue;
    }
    if (it->second->status.load() == static_cast<int>(TransferStatus::WAITING)) it->second->ctx.TryCancel();
    order_.erase(it->second.get());
    it = transfers_.erase(it);
  }
}

// ---- transfers --------------------------------------------------------------------------------------------------

// hixl_impl.cc CheckTransferOpDescs (null addresses), the engine's own connection (Ready), hixl_client.cc (no
// extents), then the request: the Python client's order
Status Hixl::HixlImpl::Extents(const char *func, const AscendString &remote, TransferOp op,
                               const std::vector<TransferOpDesc> &descs, int32_t connect_timeout_ms,
                               pb::ExtentTransferRequest *req) {
  for (const TransferOpDesc &d : descs) {
    if (d.local_addr == 0U) return Fail(func, PARAM_INVALID, "local addr of desc can not be null.");
    if (d.remote_addr == 0U) return Fail(func, PARAM_INVALID, "remote addr of desc can not be null.");
  }
  if (op != READ && op != WRITE) return Fail(func, PARAM_INVALID, "operation must be READ or WRITE");
  Status st = Ready(func, remote, connect_timeout_ms);
  if (st != SUCCESS) return st;
  if (descs.empty()) return Fail(func, PARAM_INVALID, "op_descs is empty");
  wire::Engine engine;
  st = ParseRemote(func, remote, &engine, true);
  if (st != SUCCESS) return st;
  req->set_engine_id(engine_id_);
  req->set_remote_cluster_id(wire::EngineClusterId(engine));
  req->set_write(op == WRITE);
  std::string *bytes = req->mutable_extents();
  bytes->resize(descs.size() * wire::kExtentSize);
  char *out = &(*bytes)[0];
  for (const TransferOpDesc &d : descs) {
    const uint64_t fields[3] = {d.local_addr, d.remote_addr, d.len};
    for (uint64_t f : fields) {  // little-endian u64
      for (int b = 0; b < 8; ++b) *out++ = static_cast<char>((f >> (8 * b)) & 0xFFU);
    }
  }
  return SUCCESS;
}

Status Hixl::HixlImpl::TransferSync(const AscendString &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                                    int32_t timeout_ms) {
  static const char *const kFunc = "TransferSync";
  const auto start = std::chrono::steady_clock::now();
  pb::ExtentTransferRequest req;
  Status st = Extents(kFunc, remote, op, descs, timeout_ms, &req);
  if (st != SUCCESS) return st;
  const int32_t spent = static_cast<int32_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
  if (spent >= timeout_ms) return Fail(kFunc, TIMEOUT, "the connection took the whole timeout");
  req.set_timeout_ms(static_cast<uint32_t>(timeout_ms - spent));
  // on the attach connection when it is free (no gRPC call: the hot path), else as the gRPC call; the daemon ends
  // the transfer within its timeout either way, the margin is for its answer only
  const std::string &raw = req.extents();
  std::vector<uint64_t> numbers(raw.size() / 8U);
  std::memcpy(numbers.data(), raw.data(), numbers.size() * 8U);   // little-endian hosts (as the frames)
  datadist_cpp::Status llm = 0U;
  if (attach_.TryExtents(op == WRITE, req.engine_id(), req.remote_cluster_id(), numbers, kFunc,
                         timeout_ms - spent + kRpcMarginMs, &llm)) {
    st = llm == 0U ? SUCCESS : Fail(kFunc, wire::HixlStatus(static_cast<int64_t>(llm)), "the daemon refused it");
  } else {
    pb::TransferResponse resp;
    st = Call(&pb::DataDist::Stub::TransferExtents, req, &resp, kFunc, timeout_ms - spent + kRpcMarginMs);
  }
  if (st != SUCCESS) AfterFailure(remote, st);
  return st;
}

Status Hixl::HixlImpl::TransferAsync(const AscendString &remote, TransferOp op,
                                     const std::vector<TransferOpDesc> &descs, const TransferArgs &args,
                                     TransferReq &req) {
  static const char *const kFunc = "TransferAsync";
  auto t = std::make_shared<AsyncTransfer>();
  const Status st = Extents(kFunc, remote, op, descs, kAutoConnectTimeoutMs, &t->request);
  if (st != SUCCESS) return st;
  t->request.set_timeout_ms(kAsyncTimeoutMs);  // the daemon answers TIMEOUT after it
  t->user_data = args.user_data;
  t->remote = Str(remote);
  t->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(kAsyncTimeoutMs + kRpcMarginMs));
  t->ctx.AddMetadata(datadist_cpp::kCapabilityKey, attach_.capability_hex());
  {
    std::lock_guard<std::mutex> lock(async_mu_);
    const uint64_t seq = next_seq_++;
    transfers_[seq] = t;
    order_[t.get()] = seq;
    ++in_flight_;
  }
  req = t.get();
  stub_->async()->TransferExtents(&t->ctx, &t->request, &t->response, [this, t](grpc::Status s) {
    TransferStatus done = TransferStatus::COMPLETED;
    if (!s.ok()) {
      std::string why;
      const Status hixl_status = wire::HixlStatus(datadist_cpp::FailedCallCode(t->ctx, s, &why));
      done = hixl_status == TIMEOUT ? TransferStatus::TIMEOUT : TransferStatus::FAILED;
      Fail("TransferAsync", hixl_status, "remote engine " + t->remote + ": " + why);
    }
    t->status.store(static_cast<int>(done));
    std::lock_guard<std::mutex> lock(async_mu_);
    --in_flight_;
    async_cv_.notify_all();
  });
  return SUCCESS;
}

Status Hixl::HixlImpl::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
  std::lock_guard<std::mutex> lock(async_mu_);
  auto it = order_.find(req);
  if (it == order_.end()) {
    status = TransferStatus::FAILED;
    return Fail("GetTransferStatus", PARAM_INVALID, "Request not found, request has been completed or does not exist");
  }
  auto &t = transfers_[it->second];
  status = static_cast<TransferStatus>(t->status.load());
  if (status != TransferStatus::WAITING) {  // reported once, then forgotten (hixl_engine.cc EraseTransferReq)
    transfers_.erase(it->second);
    order_.erase(it);
  }
  return SUCCESS;
}

Status Hixl::HixlImpl::GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results) {
  results.clear();
  if (args.max_query_count == 0U) return SUCCESS;
  std::lock_guard<std::mutex> lock(async_mu_);
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    const std::shared_ptr<AsyncTransfer> t = it->second;
    const TransferStatus status = static_cast<TransferStatus>(t->status.load());
    if (status != TransferStatus::WAITING) {
      order_.erase(t.get());
      it = transfers_.erase(it);
    } else {
      ++it;
    }
    if (args.skip_waiting && status == TransferStatus::WAITING) continue;
    TransferResult r;
    r.req = t.get();
    r.user_data = t->user_data;
    r.status = status;
    results.push_back(r);
    if (results.size() >= static_cast<size_t>(args.max_query_count)) break;
  }
  return SUCCESS;
}

// ---- notifies ---------------------------------------------------------------------------------------------------

Status Hixl::HixlImpl::SendNotify(const AscendString &remote, const NotifyDesc &notify, int32_t timeout_ms) {
  static const char *const kFunc = "SendNotify";
  // hixl_engine.cc SendNotify (as the Python client): over this engine's own connection only
  if (!Connected(Str(remote))) return Fail(kFunc, NOT_CONNECTED, "remote engine " + Str(remote) + " is not connected");
  wire::Engine engine;
  Status st = ParseRemote(kFunc, remote, &engine, true);
  if (st != SUCCESS) return st;
  pb::NotifyRequest req;
  req.set_engine_id(engine_id_);
  req.set_remote_cluster_id(wire::EngineClusterId(engine));
  req.set_name(notify.name.GetString(), notify.name.GetLength());
  req.set_msg(notify.notify_msg.GetString(), notify.notify_msg.GetLength());
  req.set_timeout_ms(static_cast<uint32_t>(timeout_ms));
  pb::Empty resp;
  return Call(&pb::DataDist::Stub::SendNotify, req, &resp, kFunc, timeout_ms + kRpcMarginMs);
}

Status Hixl::HixlImpl::GetNotifies(std::vector<NotifyDesc> &notifies) {
  pb::EngineRef req;
  req.set_engine_id(engine_id_);
  pb::NotifyList resp;
  const Status st = Call(&pb::DataDist::Stub::GetNotifies, req, &resp, "GetNotifies", kRpcTimeoutMs);
  if (st != SUCCESS) return st;
  notifies.clear();
  for (const auto &n : resp.notifies()) {
    NotifyDesc d;
    d.name = AscendString(n.name().data(), n.name().size());
    d.notify_msg = AscendString(n.msg().data(), n.msg().size());
    notifies.push_back(std::move(d));
  }
  return SUCCESS;
}

// ---- the public class: hixl_impl.cc's order of checks -----------------------------------------------------------

namespace {
Status NotInit(const char *func) { return Fail(func, FAILED, "Hixl is not initialized (call Initialize first)"); }
Status BadTimeout(const char *func, int32_t t) {
  return Fail(func, PARAM_INVALID, "timeout_in_millis:" + std::to_string(t) + " must > 0");
}
}  // namespace

Hixl::Hixl() {}

Hixl::~Hixl() { Finalize(); }

Status Hixl::Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options) {
  if (impl_ != nullptr) return SUCCESS;
  std::unique_ptr<HixlImpl> impl(new HixlImpl());
  const Status st = impl->Initialize(local_engine, options);
  if (st != SUCCESS) return st;
  impl_ = std::move(impl);
  return SUCCESS;
}

void Hixl::Finalize() {
  if (impl_ != nullptr) {
    impl_->Finalize();
    impl_.reset();
  }
}

Status Hixl::RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
  if (impl_ == nullptr) return NotInit("RegisterMem");
  return impl_->RegisterMem(mem, type, mem_handle);
}

Status Hixl::DeregisterMem(MemHandle mem_handle) {
  if (impl_ == nullptr) return NotInit("DeregisterMem");
  return impl_->DeregisterMem(mem_handle);
}

Status Hixl::Connect(const AscendString &remote_engine, int32_t timeout_in_millis) {
  if (impl_ == nullptr) return NotInit("Connect");
  if (timeout_in_millis <= 0) return BadTimeout("Connect", timeout_in_millis);
  return impl_->Connect("Connect", remote_engine, timeout_in_millis);
}

Status Hixl::Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis) {
  if (impl_ == nullptr) return NotInit("Disconnect");
  if (timeout_in_millis <= 0) return BadTimeout("Disconnect", timeout_in_millis);
  return impl_->Disconnect("Disconnect", remote_engine, timeout_in_millis);
}

Status Hixl::ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis) {
  if (impl_ == nullptr) return NotInit("ConnectAsync");
  if (timeout_in_millis <= 0) return BadTimeout("ConnectAsync", timeout_in_millis);
  const Status st = impl_->ConnectAsync(remote_engine, timeout_in_millis, true);
  if (st == RESOURCE_EXHAUSTED) Log(LogLevel::kWarning, "[hixl] [ConnectAsync] the connect task queue is full");
  return st;
}

Status Hixl::DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis) {
  if (impl_ == nullptr) return NotInit("DisconnectAsync");
  if (timeout_in_millis <= 0) return BadTimeout("DisconnectAsync", timeout_in_millis);
  const Status st = impl_->ConnectAsync(remote_engine, timeout_in_millis, false);
  if (st == RESOURCE_EXHAUSTED) Log(LogLevel::kWarning, "[hixl] [DisconnectAsync] the connect task queue is full");
  return st;
}

Status Hixl::GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status) {
  if (impl_ == nullptr) return NotInit("GetAsyncConnectStatus");
  return impl_->GetAsyncConnectStatus(remote_engine, status);
}

Status Hixl::GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses) {
  if (impl_ == nullptr) return NotInit("GetAsyncConnectStatus");
  return impl_->GetAsyncConnectStatus(statuses);
}

Status Hixl::TransferSync(const AscendString &remote_engine, TransferOp operation,
                          const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis) {
  if (impl_ == nullptr) return NotInit("TransferSync");
  if (timeout_in_millis <= 0) return BadTimeout("TransferSync", timeout_in_millis);
  return impl_->TransferSync(remote_engine, operation, op_descs, timeout_in_millis);
}

Status Hixl::TransferAsync(const AscendString &remote_engine, TransferOp operation,
                           const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                           TransferReq &req) {
  if (impl_ == nullptr) return NotInit("TransferAsync");
  return impl_->TransferAsync(remote_engine, operation, op_descs, optional_args, req);
}

Status Hixl::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
  if (impl_ == nullptr) return NotInit("GetTransferStatus");
  if (req == nullptr) return Fail("GetTransferStatus", FAILED, "Req is nullptr, check req.");
  return impl_->GetTransferStatus(req, status);
}

Status Hixl::GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results) {
  if (impl_ == nullptr) return NotInit("GetTransferStatus");
  return impl_->GetTransferStatus(args, results);
}

Status Hixl::SendNotify(const AscendString &remote_engine, const NotifyDesc &notify, int32_t timeout_in_millis) {
  static const char *const kFunc = "SendNotify";
  if (impl_ == nullptr) return NotInit(kFunc);
  if (notify.name.GetLength() > wire::kMaxNotifyNameLen) {
    return Fail(kFunc, PARAM_INVALID, "notify.name length exceed max limit: 1024, current: " +
                                          std::to_string(notify.name.GetLength()));
  }
  if (timeout_in_millis <= 0) return BadTimeout(kFunc, timeout_in_millis);
  if (notify.notify_msg.GetLength() > wire::kMaxNotifyMsgLen) {
    return Fail(kFunc, PARAM_INVALID, "notify.notify_msg length exceed max limit: 1024, current: " +
                                          std::to_string(notify.notify_msg.GetLength()));
  }
  return impl_->SendNotify(remote_engine, notify, timeout_in_millis);
}

Status Hixl::GetNotifies(std::vector<NotifyDesc> &notifies) {
  if (impl_ == nullptr) return NotInit("GetNotifies");
  return impl_->GetNotifies(notifies);
}

Status Hixl::GetCapability(FeatureType feature_type, int32_t &value) {
  if (static_cast<int32_t>(feature_type) < 0) return PARAM_INVALID;
  switch (feature_type) {
    case AUTO_CONNECT:
    case CLIENT_SERVER_COMM:
      value = FEATURE_SUPPORTED;
      return SUCCESS;
    default:
      value = FEATURE_NOT_SUPPORTED;
      return SUCCESS;
  }
}
}  // namespace hixl
