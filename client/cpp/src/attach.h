// Private: the attach connection to datadistd (proto/datadist/v1/attach.proto), as the Python client's
// client/llm_datadist/_attach.py: SOCK_SEQPACKET on "<worker socket>.attach", one datagram per message, file
// descriptors as SCM_RIGHTS. The daemon learns who we are from the kernel and answers the capability every gRPC
// call carries; memory crosses as descriptors; pulls and pushes go as binary frames (attach protocol 4: the layout
// of proto/datadist/fastframe.py, block lists past one datagram in continuation frames). The connection is the
// engine's lease: closing it (or this process dying) releases the engine.
//
// One request at a time (a mutex): replies are read by the caller, each wait has a deadline; a transfer that
// finds the connection busy goes as a gRPC call instead (TryTransfer), so threads of one engine pull in parallel.
#ifndef DATADIST_CPP_ATTACH_H_
#define DATADIST_CPP_ATTACH_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "datadist/v1/attach.pb.h"
#include "datadist/v1/datadist.pb.h"

namespace datadist_cpp {

class AttachClient {
 public:
  AttachClient() = default;
  ~AttachClient();
  AttachClient(const AttachClient &) = delete;
  AttachClient &operator=(const AttachClient &) = delete;

  // Connects to `path` and says hello; LLM_FAILED (logged) when nothing answers.
  Status Connect(const std::string &path, int timeout_ms);
  void Close();

  // One request and its reply within `timeout_ms`; `fd_out` gets the descriptor the reply carried (or -1).
  // The reply's own status is returned (mapped), LLM_FAILED when the connection is gone, LLM_TIMEOUT when no
  // reply came in time.
  Status Call(datadist::v1::AttachRequest &request, const char *func, const std::vector<int> &fds, int timeout_ms,
              datadist::v1::AttachReply *reply, int *fd_out);

  Status ImportMemory(const std::vector<int> &fds, const std::vector<std::pair<uint64_t, uint64_t>> &pieces,
                      uint64_t offset, uint64_t length, const char *func, uint64_t *memory_id);
  // NPU memory (memory backend "acl"): `length` bytes behind an IPC key exported for the daemon's pid.
  Status ImportDeviceMemory(const std::string &key, int32_t device, uint64_t length, const char *func,
                            uint64_t *memory_id);
  void ReleaseMemory(const std::vector<uint64_t> &memory_ids);
  // A pool of one of our engines: a descriptor (*fd, the caller closes it), or for an NPU pool (memory backend
  // "acl") *fd -1 and the IPC key only this process -- `bare_tgid`, its pid as the NPU driver knows it -- may
  // import, on physical NPU *device_id.
  Status ExportPool(uint64_t engine_id, const std::string &pool, const char *func, int32_t bare_tgid, int *fd,
                    uint64_t *size, std::string *device_key, int32_t *device_id);
  // A pull or push on this connection (no gRPC call: the local hot path), as binary frames. false when another
  // thread of the engine is waiting on the connection: the caller sends it as the gRPC Pull / Push instead.
  bool TryTransfer(bool push, const datadist::v1::TransferRequest &request, const char *func, int timeout_ms,
                   Status *status);
  // HIXL's extents (`numbers`: local_addr, remote_addr, len each) READ from or WRITTEN to (`write`) the engine
  // linked as `cluster`, as TryTransfer (fastframe KIND_EXTENTS: the daemon's TransferExtents, no gRPC call).
  bool TryExtents(bool write, uint64_t engine_id, uint64_t cluster, const std::vector<uint64_t> &numbers,
                  const char *func, int timeout_ms, Status *status);

  const std::string &capability() const { return capability_; }
  const std::string &capability_hex() const { return capability_hex_; }
  // the daemon's pid as the kernel reports it for this connection (SO_PEERCRED), never what a message says
  int32_t daemon_pid() const { return daemon_pid_; }
  // ... as the NPU driver sees it (Welcome.bare_tgid, aclrtDeviceGetBareTgid; differs from daemon_pid in a
  // container with its own PID namespace or a VM): what the IPC allow list of memory handed over must name
  int32_t daemon_tgid() const { return daemon_tgid_; }
  const std::string &memory_backend() const { return memory_backend_; }
  bool broken() const;

 private:
  Status Lost(const char *func, const std::string &why);
  Status CallLocked(datadist::v1::AttachRequest &request, const char *func, const std::vector<int> &fds,
                    int timeout_ms, datadist::v1::AttachReply *reply, int *fd_out);
  // One transfer's datagrams (`frames` of its request id) sent and its reply read, as TryTransfer says.
  bool TryFrames(const std::function<std::vector<std::string>(uint64_t)> &frames, const char *func, int timeout_ms,
                 Status *status);
  // Sends `datagrams` back to back (`fds` ride with the first).
  Status SendLocked(const std::vector<std::string> &datagrams, const std::vector<int> &fds, const char *func);
  // Reads until the reply to `rid` is in (a binary frame when `frame`, else a protobuf message; anything else is a
  // late reply nobody waits for): its `n` bytes in buf_, its descriptors in `got`.
  Status ReceiveLocked(uint64_t rid, bool frame, Clock::time_point deadline, const char *func, size_t *n,
                       std::vector<int> *got);

  mutable std::mutex mu_;
  int fd_ = -1;
  uint64_t next_id_ = 1U;
  std::string path_;
  std::string broken_;  // why the connection is gone ("" while it works)
  std::string buf_;     // one datagram read (under mu_)
  std::string capability_;
  std::string capability_hex_;
  int32_t daemon_pid_ = -1;
  int32_t daemon_tgid_ = -1;
  std::string memory_backend_ = "host";
};

}  // namespace datadist_cpp

#endif  // DATADIST_CPP_ATTACH_H_
