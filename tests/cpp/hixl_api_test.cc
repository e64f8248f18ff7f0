// hixl::Hixl through real daemons: every method and its status codes. Run by tests/cpp/test_cpp_hixl.py (which
// starts the daemons); one scenario per run:
//   hixl_api_test pair <target A> <target B> <port> <port> <port>
//       a server engine on A listening at 127.0.0.1:<port 1>, a client engine on B at 127.0.0.1:<port 2> (and an
//       AutoConnect engine on B): memory, connections (sync and async), transfers, notifies, capabilities; nothing
//       listens at <port 3>
//   hixl_api_test killed <target A> <target B> <port> <port>
//       connected, then "READY"; (the server's daemon stopped) 64 async READs, all WAITING, "INFLIGHT"; (the daemon
//       killed) each ends FAILED or TIMEOUT within its deadline
// Prints "ok <check>" / "FAIL <check>: ..." per check; exits 1 when a check failed.
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"

using namespace hixl;

namespace {
int g_failed = 0;
constexpr size_t kSize = 1U << 20;
constexpr const char kIp[] = "127.0.0.1";
// an async request's deadline in the library (30 s, as the Python client) and a margin: no wait here is longer
constexpr auto kAsyncBound = std::chrono::seconds(45);

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
    case FAILED: return "FAILED";
    default: return "?";
  }
}

void Expect(const std::string &name, Status got, Status want) {
  if (got == want) {
    std::printf("ok %s\n", name.c_str());
  } else {
    std::printf("FAIL %s: got %s (%u), want %s\n", name.c_str(), Name(got), got, Name(want));
    ++g_failed;
  }
  std::fflush(stdout);
}

void Check(const std::string &name, bool ok, const std::string &why = "") {
  std::printf(ok ? "ok %s\n" : "FAIL %s: %s\n", name.c_str(), why.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

const char *StatusName(AsyncConnectStatus s) {
  static const char *const kNames[] = {"NOT_CONNECT", "CONNECT_PENDING", "CONNECTING", "CONNECTED",
                                       "CONNECT_FAILED", "DISCONNECT_PENDING", "DISCONNECTING"};
  return kNames[static_cast<int>(s)];
}

// page-aligned private memory (the library re-backs it in place to hand it to the daemon)
uint8_t *Alloc(size_t n, int seed) {
  void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  auto *b = static_cast<uint8_t *>(p);
  for (size_t i = 0; i < n; ++i) b[i] = seed < 0 ? 0 : static_cast<uint8_t>((i * 131U + static_cast<size_t>(seed) * 7U) % 251U);
  return b;
}

std::string Engine(uint32_t port) { return std::string(kIp) + ":" + std::to_string(port); }

std::map<AscendString, AscendString> Options(const char *target, std::map<std::string, std::string> more = {}) {
  std::map<AscendString, AscendString> o{{"datadist.daemon", target}};
  for (const auto &kv : more) o[AscendString(kv.first.c_str())] = AscendString(kv.second.c_str());
  return o;
}

uintptr_t U(const uint8_t *p) { return reinterpret_cast<uintptr_t>(p); }

// ---- an engine never initialized: every call FAILED ---------------------------------------------------------
void Uninitialized(const char *tag) {
  Hixl h;
  if (std::string(tag) == "finalized") {
    h.Finalize();  // Finalize before Initialize: nothing to do
  }
  const std::string p = std::string(tag) + "_";
  AscendString remote("127.0.0.1:1");
  MemHandle handle = nullptr;
  uint8_t byte = 0;
  Expect(p + "register_mem", h.RegisterMem(MemDesc{U(&byte), 1}, MEM_HOST, handle), FAILED);
  Expect(p + "deregister_mem", h.DeregisterMem(reinterpret_cast<MemHandle>(1)), FAILED);
  Expect(p + "connect", h.Connect(remote, 1000), FAILED);
  Expect(p + "disconnect", h.Disconnect(remote, 1000), FAILED);
  Expect(p + "connect_async", h.ConnectAsync(remote, 1000), FAILED);
  Expect(p + "disconnect_async", h.DisconnectAsync(remote, 1000), FAILED);
  AsyncConnectStatus status = AsyncConnectStatus::CONNECTED;
  Expect(p + "get_async_connect_status", h.GetAsyncConnectStatus(remote, status), FAILED);
  std::map<AscendString, AsyncConnectStatus> statuses;
  Expect(p + "get_async_connect_status_all", h.GetAsyncConnectStatus(statuses), FAILED);
  std::vector<TransferOpDesc> ops{{U(&byte), 1, 1}};
  Expect(p + "transfer_sync", h.TransferSync(remote, READ, ops, 1000), FAILED);
  TransferReq req = nullptr;
  Expect(p + "transfer_async", h.TransferAsync(remote, READ, ops, TransferArgs{}, req), FAILED);
  TransferStatus ts = TransferStatus::WAITING;
  Expect(p + "get_transfer_status", h.GetTransferStatus(reinterpret_cast<TransferReq>(1), ts), FAILED);
  std::vector<TransferResult> results;
  Expect(p + "get_transfer_status_all", h.GetTransferStatus(GetTransferStatusArgs{}, results), FAILED);
  Expect(p + "send_notify", h.SendNotify(remote, NotifyDesc{"n", "m"}, 1000), FAILED);
  std::vector<NotifyDesc> notifies;
  Expect(p + "get_notifies", h.GetNotifies(notifies), FAILED);
}

void Capability() {
  int32_t v = -7;
  Expect("capability_auto_connect", Hixl::GetCapability(AUTO_CONNECT, v), SUCCESS);
  Check("capability_auto_connect_supported", v == FEATURE_SUPPORTED, std::to_string(v));
  v = -7;
  Expect("capability_client_server_comm", Hixl::GetCapability(CLIENT_SERVER_COMM, v), SUCCESS);
  Check("capability_client_server_comm_supported", v == FEATURE_SUPPORTED, std::to_string(v));
  v = -7;  // hixl_impl.cc: an unknown (non-negative) feature is SUCCESS, FEATURE_NOT_SUPPORTED
  Expect("capability_unknown", Hixl::GetCapability(static_cast<FeatureType>(7), v), SUCCESS);
  Check("capability_unknown_not_supported", v == FEATURE_NOT_SUPPORTED, std::to_string(v));
  v = -7;  // a negative one: PARAM_INVALID, value untouched
  Expect("capability_negative", Hixl::GetCapability(static_cast<FeatureType>(-1), v), PARAM_INVALID);
  Check("capability_negative_untouched", v == -7, std::to_string(v));
}

void InitializeChecks(const char *target) {
  {
    Hixl h;
    Expect("init_bad_engine", h.Initialize("256.0.0.1", Options(target)), PARAM_INVALID);
    Expect("init_bad_engine_text", h.Initialize("not-an-engine:1", Options(target)), PARAM_INVALID);
    // an option the HIXL engine does not support (hixl_engine.cc CheckSupportedOptions), as the Python client
    Expect("init_unsupported_option", h.Initialize(kIp, Options(target, {{"NoSuchOption", "1"}})),
           PARAM_INVALID);
    Expect("init_fabric_mem_unsupported",
           h.Initialize(kIp, Options(target, {{OPTION_ENABLE_USE_FABRIC_MEM, "1"}})), PARAM_INVALID);
    Expect("init_fabric_mem_bad_value",
           h.Initialize(kIp, Options(target, {{OPTION_ENABLE_USE_FABRIC_MEM, "2"}})), PARAM_INVALID);
    Expect("init_auto_connect_bad", h.Initialize(kIp, Options(target, {{OPTION_AUTO_CONNECT, "2"}})),
           PARAM_INVALID);
    Expect("init_buffer_pool_bad", h.Initialize(kIp, Options(target, {{OPTION_BUFFER_POOL, "4:8"}})),
           PARAM_INVALID);
    // refused ones leave it uninitialized
    MemHandle handle = nullptr;
    uint8_t byte = 0;
    Expect("init_refused_stays_uninitialized", h.RegisterMem(MemDesc{U(&byte), 1}, MEM_HOST, handle), FAILED);
    Expect("init_ok", h.Initialize(kIp,
                                   Options(target, {{OPTION_BUFFER_POOL, "0:0"}, {OPTION_AUTO_CONNECT, "0"}})),
           SUCCESS);
    Expect("init_repeated", h.Initialize(kIp, Options(target)), SUCCESS);
    Expect("init_repeated_other_engine", h.Initialize("256.0.0.1", Options(target)), SUCCESS);  // ignored
    h.Finalize();
    Expect("after_finalize_connect", h.Connect("127.0.0.1:1", 1000), FAILED);
  }
  Hixl nodaemon;
  Expect("init_no_daemon", nodaemon.Initialize(kIp, Options("unix:///nonexistent/datadistd.sock")), FAILED);
}

// ---- the pair ---------------------------------------------------------------------------------------------------

struct Pair {
  Hixl server, client;
  std::string remote, self, nobody;
  uint8_t *sb = nullptr, *cb = nullptr;
  MemHandle sh = nullptr, ch = nullptr;
};

void Memory(Pair &p) {
  MemHandle h = nullptr;
  Expect("register_null_addr", p.client.RegisterMem(MemDesc{0, 64}, MEM_HOST, h), PARAM_INVALID);
  Expect("register_server", p.server.RegisterMem(MemDesc{U(p.sb), kSize}, MEM_HOST, p.sh), SUCCESS);
  Expect("register_client", p.client.RegisterMem(MemDesc{U(p.cb), kSize}, MEM_HOST, p.ch), SUCCESS);
  Check("register_handle_non_null", p.sh != nullptr && p.ch != nullptr);
  MemHandle again = nullptr;
  Expect("register_same_range", p.client.RegisterMem(MemDesc{U(p.cb), kSize}, MEM_HOST, again), SUCCESS);
  Check("register_same_range_same_handle", again == p.ch);
  Expect("register_overlapping", p.client.RegisterMem(MemDesc{U(p.cb) + 4096, 4096}, MEM_HOST, h), PARAM_INVALID);
  Expect("deregister_null", p.client.DeregisterMem(nullptr), PARAM_INVALID);
  Expect("deregister_unknown", p.client.DeregisterMem(reinterpret_cast<MemHandle>(0xDEAD0)), SUCCESS);
  // a second registration, deregistered while not connected
  uint8_t *extra = Alloc(8192, 5);
  MemHandle eh = nullptr;
  Expect("register_extra", p.client.RegisterMem(MemDesc{U(extra), 8192}, MEM_HOST, eh), SUCCESS);
  Check("register_extra_new_handle", eh != nullptr && eh != p.ch);
  Expect("deregister_extra", p.client.DeregisterMem(eh), SUCCESS);
  Expect("deregister_extra_again", p.client.DeregisterMem(eh), SUCCESS);  // now unknown
}

void Connections(Pair &p) {
  Expect("disconnect_not_connected", p.client.Disconnect(p.remote.c_str(), 1000), NOT_CONNECTED);
  Expect("connect_timeout_zero", p.client.Connect(p.remote.c_str(), 0), PARAM_INVALID);
  Expect("connect_timeout_negative", p.client.Connect(p.remote.c_str(), -5), PARAM_INVALID);
  Expect("disconnect_timeout_zero", p.client.Disconnect(p.remote.c_str(), 0), PARAM_INVALID);
  Expect("connect_self", p.client.Connect(p.self.c_str(), 1000), PARAM_INVALID);
  Expect("connect_no_port", p.client.Connect(kIp, 1000), PARAM_INVALID);
  Expect("connect_bad_engine", p.client.Connect("not-an-ip:1", 1000), PARAM_INVALID);
  Expect("connect_nobody_listens", p.client.Connect(p.nobody.c_str(), 1000), FAILED);
  Expect("connect", p.client.Connect(p.remote.c_str(), 5000), SUCCESS);
  Expect("connect_twice", p.client.Connect(p.remote.c_str(), 5000), ALREADY_CONNECTED);
  Expect("deregister_while_connected", p.client.DeregisterMem(p.ch), FAILED);
  // the server made no connection: its own deregistration is not held up by the client's (checked later)
}

// polls the status of `remote` until `want` (bounded); the statuses seen, in order, without repeats
std::vector<AsyncConnectStatus> Follow(Hixl &h, const std::string &remote, AsyncConnectStatus want) {
  std::vector<AsyncConnectStatus> seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    AsyncConnectStatus s = AsyncConnectStatus::NOT_CONNECT;
    if (h.GetAsyncConnectStatus(remote.c_str(), s) != SUCCESS) break;
    if (seen.empty() || seen.back() != s) seen.push_back(s);
    if (s == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return seen;
}

// every status of `seen` is in `order` and they come in its order
bool InOrder(const std::vector<AsyncConnectStatus> &seen, const std::vector<AsyncConnectStatus> &order,
             std::string *text) {
  size_t at = 0;
  bool ok = true;
  for (AsyncConnectStatus s : seen) {
    *text += std::string(StatusName(s)) + " ";
    while (at < order.size() && order[at] != s) ++at;
    if (at == order.size()) ok = false;
  }
  return ok && !seen.empty() && seen.back() == order.back();
}

void AsyncConnections(Pair &p) {
  using S = AsyncConnectStatus;
  Expect("connect_async_timeout_zero", p.client.ConnectAsync(p.remote.c_str(), 0), PARAM_INVALID);
  Expect("disconnect_async_timeout_zero", p.client.DisconnectAsync(p.remote.c_str(), -1), PARAM_INVALID);
  S s = S::CONNECTED;
  Expect("async_status_unknown", p.client.GetAsyncConnectStatus("10.9.9.9:9", s), SUCCESS);
  Check("async_status_unknown_not_connect", s == S::NOT_CONNECT, StatusName(s));
  // disconnect the sync connection through the pool: DISCONNECT_PENDING -> DISCONNECTING -> (gone)
  Expect("disconnect_async", p.client.DisconnectAsync(p.remote.c_str(), 5000), SUCCESS);
  std::string text;
  Check("disconnect_async_statuses",
        InOrder(Follow(p.client, p.remote, S::NOT_CONNECT), {S::DISCONNECT_PENDING, S::DISCONNECTING, S::NOT_CONNECT},
                &text), text);
  Expect("disconnected_async_disconnect_again", p.client.Disconnect(p.remote.c_str(), 1000), NOT_CONNECTED);
  // connect: CONNECT_PENDING -> CONNECTING -> CONNECTED
  Expect("connect_async", p.client.ConnectAsync(p.remote.c_str(), 5000), SUCCESS);
  text.clear();
  Check("connect_async_statuses",
        InOrder(Follow(p.client, p.remote, S::CONNECTED), {S::CONNECT_PENDING, S::CONNECTING, S::CONNECTED}, &text),
        text);
  Expect("connect_async_connected", p.client.Connect(p.remote.c_str(), 1000), ALREADY_CONNECTED);
  // nothing listening: -> CONNECT_FAILED
  Expect("connect_async_nobody", p.client.ConnectAsync(p.nobody.c_str(), 1000), SUCCESS);
  text.clear();
  Check("connect_async_nobody_statuses",
        InOrder(Follow(p.client, p.nobody, S::CONNECT_FAILED), {S::CONNECT_PENDING, S::CONNECTING, S::CONNECT_FAILED},
                &text), text);
  std::map<AscendString, S> all;
  Expect("async_status_all", p.client.GetAsyncConnectStatus(all), SUCCESS);
  Check("async_status_all_entries", all.size() == 2U && all[p.remote.c_str()] == S::CONNECTED &&
                                        all[p.nobody.c_str()] == S::CONNECT_FAILED,
        std::to_string(all.size()));
  // a disconnect queued behind a connect of the same remote: the connect's progress never overwrites its
  // DISCONNECT_PENDING (connect_pool_executor.cc SetStatus); it ends NOT_CONNECT
  Expect("disconnect_then", p.client.DisconnectAsync(p.remote.c_str(), 5000), SUCCESS);
  (void)Follow(p.client, p.remote, S::NOT_CONNECT);
  Expect("connect_then", p.client.ConnectAsync(p.remote.c_str(), 5000), SUCCESS);
  Expect("disconnect_queued", p.client.DisconnectAsync(p.remote.c_str(), 5000), SUCCESS);
  text.clear();
  Check("disconnect_queued_statuses",
        InOrder(Follow(p.client, p.remote, S::NOT_CONNECT), {S::DISCONNECT_PENDING, S::DISCONNECTING, S::NOT_CONNECT},
                &text), text);
  Expect("async_status_all_after", p.client.GetAsyncConnectStatus(all), SUCCESS);
  Check("async_status_all_after_entries", all.size() == 1U && all.count(p.remote.c_str()) == 0U,
        std::to_string(all.size()));
  Expect("disconnect_after_queued", p.client.Disconnect(p.remote.c_str(), 1000), NOT_CONNECTED);
}

std::vector<uint8_t> Snap(const uint8_t *b) { return std::vector<uint8_t>(b, b + kSize); }
bool Same(const uint8_t *b, const std::vector<uint8_t> &s) { return std::memcmp(b, s.data(), kSize) == 0; }

void Transfers(Pair &p) {
  const uintptr_t cb = U(p.cb), sb = U(p.sb);
  const std::vector<uint8_t> server_data = Snap(p.sb);
  std::vector<TransferOpDesc> one{{cb, sb, 4096}};
  Expect("transfer_sync_not_connected", p.client.TransferSync(p.remote.c_str(), READ, one, 1000), NOT_CONNECTED);
  TransferReq req = nullptr;
  Expect("transfer_async_not_connected", p.client.TransferAsync(p.remote.c_str(), READ, one, TransferArgs{}, req),
         NOT_CONNECTED);
  Expect("transfer_connect", p.client.Connect(p.remote.c_str(), 5000), SUCCESS);
  // READ: 10,000 extents of 37 bytes in one call, byte-exact
  constexpr size_t kN = 10000, kStep = 100;
  std::vector<TransferOpDesc> rows;
  for (size_t i = 0; i < kN; ++i) rows.push_back({cb + i * kStep + 3, sb + i * kStep, 37});
  Expect("read_10000_extents", p.client.TransferSync(p.remote.c_str(), READ, rows, 10000), SUCCESS);
  std::vector<uint8_t> want(kSize, 0);
  for (size_t i = 0; i < kN; ++i) std::memcpy(&want[i * kStep + 3], &server_data[i * kStep], 37);
  Check("read_10000_extents_bytes", Same(p.cb, want));
  // WRITE: 10,000 extents of 50 bytes, back to front
  const std::vector<uint8_t> client_data = Snap(p.cb);
  rows.clear();
  for (size_t i = 0; i < kN; ++i) rows.push_back({cb + i * kStep, sb + kSize - i * kStep - 50, 50});
  Expect("write_10000_extents", p.client.TransferSync(p.remote.c_str(), WRITE, rows, 10000), SUCCESS);
  std::vector<uint8_t> expect = server_data;
  for (size_t i = 0; i < kN; ++i) std::memcpy(&expect[kSize - i * kStep - 50], &client_data[i * kStep], 50);
  Check("write_10000_extents_bytes", Same(p.sb, expect));
  // extents outside a registration: the whole call refused, nothing read or written
  const std::vector<uint8_t> before = Snap(p.cb), server_before = Snap(p.sb);
  const std::vector<std::vector<TransferOpDesc>> bad = {
      {{cb, sb, 16}, {cb + 16, sb + kSize - 8, 16}},  // the second runs past the remote registration's end
      {{cb, sb - 4096, 16}},                          // before it
      {{cb + kSize - 8, sb, 16}},                     // past the local registration's end
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    for (TransferOp op : {READ, WRITE}) {
      const std::string n = "outside_" + std::to_string(i) + (op == READ ? "_read" : "_write");
      Expect(n, p.client.TransferSync(p.remote.c_str(), op, bad[i], 5000), PARAM_INVALID);
      Check(n + "_nothing_moved", Same(p.cb, before) && Same(p.sb, server_before));
    }
  }
  Expect("transfer_null_local", p.client.TransferSync(p.remote.c_str(), READ, {{0, sb, 16}}, 1000), PARAM_INVALID);
  Expect("transfer_null_remote", p.client.TransferSync(p.remote.c_str(), READ, {{cb, 0, 16}}, 1000), PARAM_INVALID);
  Expect("transfer_no_extents", p.client.TransferSync(p.remote.c_str(), READ, {}, 1000), PARAM_INVALID);
  Expect("transfer_timeout_zero", p.client.TransferSync(p.remote.c_str(), READ, one, 0), PARAM_INVALID);
  Expect("transfer_async_null", p.client.TransferAsync(p.remote.c_str(), READ, {{0, sb, 16}}, TransferArgs{}, req),
         PARAM_INVALID);
}

void AsyncTransfers(Pair &p) {
  const uintptr_t cb = U(p.cb), sb = U(p.sb);
  std::memset(p.cb, 0, kSize);
  const std::vector<uint8_t> server_data = Snap(p.sb);
  TransferStatus ts = TransferStatus::COMPLETED;
  Expect("get_status_null_req", p.client.GetTransferStatus(nullptr, ts), FAILED);
  Expect("get_status_unknown_req", p.client.GetTransferStatus(reinterpret_cast<TransferReq>(0x10), ts), PARAM_INVALID);
  Check("get_status_unknown_req_failed", ts == TransferStatus::FAILED);
  // 256 requests in flight, started from this one thread
  constexpr size_t kReqs = 256, kBytes = 4096;
  std::vector<TransferReq> reqs(kReqs, nullptr);
  size_t started = 0;
  for (size_t i = 0; i < kReqs; ++i) {
    TransferArgs args;
    args.user_data = reinterpret_cast<const void *>(1000 + i);
    std::vector<TransferOpDesc> op{{cb + i * kBytes, sb + i * kBytes, kBytes}};
    if (p.client.TransferAsync(p.remote.c_str(), READ, op, args, reqs[i]) == SUCCESS && reqs[i] != nullptr) ++started;
  }
  Check("async_256_started", started == kReqs, std::to_string(started));
  std::set<TransferReq> distinct(reqs.begin(), reqs.end());
  Check("async_256_distinct_reqs", distinct.size() == kReqs);
  // the first by itself: WAITING until it ends; reported finished once, then unknown
  const auto deadline = std::chrono::steady_clock::now() + kAsyncBound;
  Status st = SUCCESS;
  ts = TransferStatus::WAITING;
  while (std::chrono::steady_clock::now() < deadline) {
    st = p.client.GetTransferStatus(reqs[0], ts);
    if (st != SUCCESS || ts != TransferStatus::WAITING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Expect("async_one_status", st, SUCCESS);
  Check("async_one_completed", ts == TransferStatus::COMPLETED, std::to_string(static_cast<int>(ts)));
  Expect("async_one_reported_once", p.client.GetTransferStatus(reqs[0], ts), PARAM_INVALID);
  // the rest through GetTransferStatus(args): max_query_count bounds each answer, skip_waiting leaves the waiting out
  std::vector<TransferResult> results;
  GetTransferStatusArgs none;
  none.max_query_count = 0U;
  Expect("async_query_zero", p.client.GetTransferStatus(none, results), SUCCESS);
  Check("async_query_zero_empty", results.empty(), std::to_string(results.size()));
  std::map<TransferReq, TransferResult> finished;
  std::string bad;
  for (int round = 0; finished.size() < kReqs - 1 && std::chrono::steady_clock::now() < deadline; ++round) {
    GetTransferStatusArgs args;
    args.max_query_count = 16U;
    args.skip_waiting = round % 2 == 0;
    if (p.client.GetTransferStatus(args, results) != SUCCESS) bad += "query failed; ";
    if (results.size() > 16U) bad += "more than max_query_count; ";
    for (const TransferResult &r : results) {
      if (r.status == TransferStatus::WAITING) {
        if (args.skip_waiting) bad += "a waiting one despite skip_waiting; ";
        continue;
      }
      if (!finished.emplace(r.req, r).second) bad += "a finished request reported twice; ";
    }
    if (results.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Check("async_query_rules", bad.empty(), bad);
  Check("async_all_reported", finished.size() == kReqs - 1, std::to_string(finished.size()));
  size_t completed = 0, right_data = 0;
  for (size_t i = 1; i < kReqs; ++i) {
    auto it = finished.find(reqs[i]);
    if (it == finished.end()) continue;
    completed += it->second.status == TransferStatus::COMPLETED ? 1U : 0U;
    right_data += it->second.user_data == reinterpret_cast<const void *>(1000 + i) ? 1U : 0U;
  }
  Check("async_all_completed", completed == kReqs - 1, std::to_string(completed));
  Check("async_user_data", right_data == kReqs - 1, std::to_string(right_data));
  Expect("async_query_after", p.client.GetTransferStatus(GetTransferStatusArgs{}, results), SUCCESS);
  Check("async_query_after_empty", results.empty(), std::to_string(results.size()));
  std::vector<uint8_t> want(kSize, 0);
  std::memcpy(want.data(), server_data.data(), kReqs * kBytes);
  Check("async_256_bytes", Same(p.cb, want));
  Expect("async_one_status_after", p.client.GetTransferStatus(reqs[5], ts), PARAM_INVALID);
}

void Notifies(Pair &p) {
  const char *remote = p.remote.c_str();
  Expect("notify_connect", p.client.Connect(remote, 5000), ALREADY_CONNECTED);
  for (int i = 0; i < 5; ++i) {
    const std::string name = "n" + std::to_string(i), msg(static_cast<size_t>(i), 'm');
    Expect("notify_send_" + std::to_string(i), p.client.SendNotify(remote, NotifyDesc{name.c_str(), msg.c_str()}),
           SUCCESS);
  }
  const std::string longest(1024, 'x'), too_long(1025, 'x');
  Expect("notify_name_1024", p.client.SendNotify(remote, NotifyDesc{longest.c_str(), longest.c_str()}, 1000), SUCCESS);
  std::vector<NotifyDesc> got;
  Expect("notify_get", p.server.GetNotifies(got), SUCCESS);
  bool in_order = got.size() == 6U;
  for (size_t i = 0; in_order && i < 5; ++i) {
    in_order = std::string(got[i].name.GetString()) == "n" + std::to_string(i) &&
               got[i].notify_msg.GetLength() == i;
  }
  in_order = in_order && got[5].name.GetLength() == 1024U;
  Check("notify_in_order", in_order, std::to_string(got.size()));
  Expect("notify_get_again", p.server.GetNotifies(got), SUCCESS);
  Check("notify_taken", got.empty(), std::to_string(got.size()));
  Expect("notify_name_1025", p.client.SendNotify(remote, NotifyDesc{too_long.c_str(), "m"}, 1000), PARAM_INVALID);
  Expect("notify_msg_1025", p.client.SendNotify(remote, NotifyDesc{"n", too_long.c_str()}, 1000), PARAM_INVALID);
  Expect("notify_timeout_zero", p.client.SendNotify(remote, NotifyDesc{"n", "m"}, 0), PARAM_INVALID);
  // the server made no connection: it may not notify the client (HIXL: a notify goes over one's own connection)
  Expect("notify_not_connected", p.server.SendNotify(p.self.c_str(), NotifyDesc{"n", "m"}, 1000), NOT_CONNECTED);
  Expect("notify_get_client", p.client.GetNotifies(got), SUCCESS);
  Check("notify_client_none", got.empty(), std::to_string(got.size()));
}

void AutoConnect(Pair &p, const char *target) {
  Hixl a;
  Expect("auto_init", a.Initialize(kIp, Options(target, {{OPTION_AUTO_CONNECT, "1"}})), SUCCESS);
  uint8_t *buf = Alloc(kSize, -1);
  MemHandle h = nullptr;
  Expect("auto_register", a.RegisterMem(MemDesc{U(buf), kSize}, MEM_HOST, h), SUCCESS);
  const std::vector<uint8_t> server_data = Snap(p.sb);
  Expect("auto_transfer_sync", a.TransferSync(p.remote.c_str(), READ, {{U(buf), U(p.sb), 8192}}, 5000), SUCCESS);
  Check("auto_transfer_sync_bytes", std::memcmp(buf, server_data.data(), 8192) == 0);
  Expect("auto_connected", a.Connect(p.remote.c_str(), 5000), ALREADY_CONNECTED);
  Expect("auto_disconnect", a.Disconnect(p.remote.c_str(), 5000), SUCCESS);
  TransferReq req = nullptr;
  Expect("auto_transfer_async", a.TransferAsync(p.remote.c_str(), READ, {{U(buf) + 8192, U(p.sb) + 8192, 8192}},
                                                TransferArgs{}, req), SUCCESS);
  TransferStatus ts = TransferStatus::WAITING;
  const auto deadline = std::chrono::steady_clock::now() + kAsyncBound;
  while (std::chrono::steady_clock::now() < deadline && a.GetTransferStatus(req, ts) == SUCCESS &&
         ts == TransferStatus::WAITING) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Check("auto_transfer_async_completed", ts == TransferStatus::COMPLETED, std::to_string(static_cast<int>(ts)));
  Check("auto_transfer_async_bytes", std::memcmp(buf + 8192, server_data.data() + 8192, 8192) == 0);
  Expect("auto_disconnect_again", a.Disconnect(p.remote.c_str(), 5000), SUCCESS);
  Expect("auto_deregister", a.DeregisterMem(h), SUCCESS);
  a.Finalize();
}

int RunPair(const char *ta, const char *tb, uint32_t sport, uint32_t cport, uint32_t nport) {
  Uninitialized("uninitialized");
  Uninitialized("finalized");
  Capability();
  InitializeChecks(ta);
  Pair p;
  p.remote = Engine(sport);
  p.self = Engine(cport);
  p.nobody = Engine(nport);
  p.sb = Alloc(kSize, 1);
  p.cb = Alloc(kSize, -1);
  Expect("init_server", p.server.Initialize(p.remote.c_str(), Options(ta)), SUCCESS);
  Expect("init_client", p.client.Initialize(p.self.c_str(), Options(tb)), SUCCESS);
  Memory(p);
  Connections(p);
  AsyncConnections(p);
  Transfers(p);
  AsyncTransfers(p);
  Notifies(p);
  AutoConnect(p, tb);
  // the server made no connection of its own: it may deregister while the client is connected to it; then the
  // client's transfers touching that memory are refused
  Expect("server_deregister", p.server.DeregisterMem(p.sh), SUCCESS);
  Expect("read_deregistered", p.client.TransferSync(p.remote.c_str(), READ, {{U(p.cb), U(p.sb), 16}}, 5000),
         PARAM_INVALID);
  Expect("disconnect", p.client.Disconnect(p.remote.c_str(), 5000), SUCCESS);
  Expect("disconnect_twice", p.client.Disconnect(p.remote.c_str(), 5000), NOT_CONNECTED);
  Expect("deregister_after_disconnect", p.client.DeregisterMem(p.ch), SUCCESS);
  p.client.Finalize();
  p.server.Finalize();
  std::vector<NotifyDesc> none;
  Expect("finalized_call", p.client.GetNotifies(none), FAILED);
  std::printf("%s\n", g_failed == 0 ? "ALL OK" : "SOME FAILED");
  return g_failed == 0 ? 0 : 1;
}

void WaitLine(const char *says) {
  std::printf("%s\n", says);
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);
}

// 64 async READs in flight when the server's daemon is killed: each ends FAILED or TIMEOUT within its deadline
int RunKilled(const char *ta, const char *tb, uint32_t sport, uint32_t cport) {
  Pair p;
  p.remote = Engine(sport);
  p.sb = Alloc(kSize, 1);
  p.cb = Alloc(kSize, -1);
  Expect("init_server", p.server.Initialize(p.remote.c_str(), Options(ta)), SUCCESS);
  Expect("init_client", p.client.Initialize(Engine(cport).c_str(), Options(tb)), SUCCESS);
  Expect("register_server", p.server.RegisterMem(MemDesc{U(p.sb), kSize}, MEM_HOST, p.sh), SUCCESS);
  Expect("register_client", p.client.RegisterMem(MemDesc{U(p.cb), kSize}, MEM_HOST, p.ch), SUCCESS);
  Expect("connect", p.client.Connect(p.remote.c_str(), 5000), SUCCESS);
  Expect("read_before", p.client.TransferSync(p.remote.c_str(), READ, {{U(p.cb), U(p.sb), 4096}}, 5000), SUCCESS);
  WaitLine("READY");  // the server's daemon is stopped (SIGSTOP): nothing it serves can finish
  constexpr size_t kReqs = 64;
  std::vector<TransferReq> reqs;
  for (size_t i = 0; i < kReqs; ++i) {
    TransferReq req = nullptr;
    std::vector<TransferOpDesc> op{{U(p.cb) + i * 4096, U(p.sb) + i * 4096, 4096}};
    if (p.client.TransferAsync(p.remote.c_str(), READ, op, TransferArgs{}, req) == SUCCESS) reqs.push_back(req);
  }
  Check("killed_started", reqs.size() == kReqs, std::to_string(reqs.size()));
  std::vector<TransferResult> results;
  Expect("killed_query", p.client.GetTransferStatus(GetTransferStatusArgs{}, results), SUCCESS);
  size_t waiting = 0;
  for (const TransferResult &r : results) waiting += r.status == TransferStatus::WAITING ? 1U : 0U;
  Check("killed_all_waiting", results.size() == kReqs && waiting == kReqs, std::to_string(waiting));
  WaitLine("INFLIGHT");  // the daemon is killed now (SIGKILL)
  std::map<TransferReq, TransferStatus> finals;
  const auto deadline = std::chrono::steady_clock::now() + kAsyncBound;
  while (finals.size() < kReqs && std::chrono::steady_clock::now() < deadline) {
    GetTransferStatusArgs args;
    args.skip_waiting = true;
    if (p.client.GetTransferStatus(args, results) != SUCCESS) break;
    for (const TransferResult &r : results) finals[r.req] = r.status;
    if (results.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  size_t failed = 0;
  for (const auto &kv : finals) {
    failed += kv.second == TransferStatus::FAILED || kv.second == TransferStatus::TIMEOUT ? 1U : 0U;
  }
  Check("killed_all_ended", finals.size() == kReqs, std::to_string(finals.size()) + " of 64 ended in time");
  Check("killed_all_failed_or_timeout", failed == finals.size(), std::to_string(failed));
  const Status st = p.client.TransferSync(p.remote.c_str(), READ, {{U(p.cb), U(p.sb), 4096}}, 2000);
  Check("killed_transfer_sync_fails", st != SUCCESS, Name(st));
  p.client.Finalize();
  std::printf("%s\n", g_failed == 0 ? "ALL OK" : "SOME FAILED");
  return g_failed == 0 ? 0 : 1;
}
}  // namespace

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "pair" && argc == 7) {
    return RunPair(argv[2], argv[3], static_cast<uint32_t>(std::stoul(argv[4])),
                   static_cast<uint32_t>(std::stoul(argv[5])), static_cast<uint32_t>(std::stoul(argv[6])));
  }
  if (mode == "killed" && argc == 6) {
    return RunKilled(argv[2], argv[3], static_cast<uint32_t>(std::stoul(argv[4])),
                     static_cast<uint32_t>(std::stoul(argv[5])));
  }
  std::fprintf(stderr, "usage: hixl_api_test pair <A> <B> <port> <port> <port> | killed <A> <B> <port> <port>\n");
  return 2;
}
