#include "attach.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace datadist_cpp {
namespace {
constexpr uint32_t kProtocolVersion = 2U;  // identity, memory, and pulls/pushes as protobuf
constexpr size_t kMaxDatagram = 64U << 10U;  // datadist/fastframe.py MAX_DATAGRAM
constexpr size_t kMaxFds = 16U;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

std::string Hex(const std::string &bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2U);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4U]);
    out.push_back(kDigits[c & 0xFU]);
  }
  return out;
}
}  // namespace

AttachClient::~AttachClient() { Close(); }

void AttachClient::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) {
    (void)shutdown(fd_, SHUT_RDWR);
    (void)close(fd_);
    fd_ = -1;
  }
  if (broken_.empty()) {
    broken_ = "the attach connection is closed";
  }
}

bool AttachClient::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !broken_.empty();
}

Status AttachClient::Connect(const std::string &path, int timeout_ms) {
  path_ = path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return Fail("Initialize", llm_datadist::LLM_PARAM_INVALID, "attach socket path too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1U);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return Fail("Initialize", llm_datadist::LLM_FAILED, std::string("socket: ") + std::strerror(errno));
  }
  if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    (void)close(fd);
    return Fail("Initialize", llm_datadist::LLM_FAILED,
                "cannot attach to datadistd at " + path + ": " + std::strerror(err) +
                    "; is it running, and is this user in its group?");
  }
  timeval tv{};
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // a send the daemon does not take fails
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd_ = fd;
    broken_.clear();
  }
  datadist::v1::AttachRequest hello;
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  datadist::v1::AttachReply reply;
  int reply_fd = -1;
  const Status st = Call(hello, "Initialize", {}, timeout_ms, &reply, &reply_fd);
  if (reply_fd >= 0) {
    (void)close(reply_fd);
  }
  if (st != llm_datadist::LLM_SUCCESS) {
    Close();
    return st;
  }
  if (!reply.has_welcome() || reply.welcome().capability().empty()) {
    Close();
    return Fail("Initialize", llm_datadist::LLM_FAILED, "datadistd answered the hello without a welcome");
  }
  capability_ = reply.welcome().capability();
  capability_hex_ = Hex(capability_);
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0) {
    daemon_pid_ = cred.pid;
  }
  // ... as the NPU driver knows it (its word where PID namespaces differ; the kernel's where it sends none)
  daemon_tgid_ = reply.welcome().bare_tgid() > 0 ? reply.welcome().bare_tgid() : daemon_pid_;
  protocol_ = reply.welcome().protocol_version();
  if (!reply.welcome().memory_backend().empty()) {
    memory_backend_ = reply.welcome().memory_backend();
  }
  Log(LogLevel::kInfo, "attached to datadistd " + reply.welcome().daemon_version() + " at " + path +
                           " (memory backend " + memory_backend_ + ")");
  return llm_datadist::LLM_SUCCESS;
}

Status AttachClient::Lost(const char *func, const std::string &why) {
  // under mu_
  if (broken_.empty()) {
    broken_ = why;
    Log(LogLevel::kWarning, "datadistd at " + path_ + " is gone: this engine and its caches are released (" + why +
                                "); Finalize and Initialize again once it is back");
  }
  return Fail(func, llm_datadist::LLM_FAILED, why);
}

Status AttachClient::Call(datadist::v1::AttachRequest &request, const char *func, const std::vector<int> &fds,
                          int timeout_ms, datadist::v1::AttachReply *reply, int *fd_out) {
  std::lock_guard<std::mutex> lock(mu_);
  return CallLocked(request, func, fds, timeout_ms, reply, fd_out);
}

Status AttachClient::CallLocked(datadist::v1::AttachRequest &request, const char *func, const std::vector<int> &fds,
                                int timeout_ms, datadist::v1::AttachReply *reply, int *fd_out) {
  *fd_out = -1;
  if (!broken_.empty() || fd_ < 0) {
    return Fail(func, llm_datadist::LLM_FAILED, broken_.empty() ? "not attached to datadistd" : broken_);
  }
  if (fds.size() > kMaxFds) {
    return Fail(func, llm_datadist::LLM_PARAM_INVALID, "too many descriptors for one message");
  }
  const uint64_t rid = next_id_++;
  request.set_request_id(rid);
  std::string data;
  if (!request.SerializeToString(&data) || data.size() > kMaxDatagram) {
    return Fail(func, llm_datadist::LLM_PARAM_INVALID, "the request does not fit one attach message");
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);

  iovec iov{const_cast<char *>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {
    sent = sendmsg(fd_, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Fail(func, llm_datadist::LLM_TIMEOUT, "datadistd did not take the request in time");
    }
    return Lost(func, std::string("the attach connection to datadistd failed: ") + std::strerror(errno));
  }

  if (buf_.size() < kMaxDatagram) {
    buf_.resize(kMaxDatagram);
  }
  std::string &buf = buf_;
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int left = RemainingMs(deadline);
    const int ready = poll(&p, 1, left);
    if (ready < 0 && errno == EINTR) {
      continue;
    }
    if (ready == 0) {
      return Fail(func, llm_datadist::LLM_TIMEOUT, "datadistd did not answer in time");
    }
    if (ready < 0) {
      return Lost(func, std::string("poll: ") + std::strerror(errno));
    }
    iovec riov{&buf[0], buf.size()};
    msghdr rmsg{};
    rmsg.msg_iov = &riov;
    rmsg.msg_iovlen = 1;
    alignas(cmsghdr) char rcontrol[CMSG_SPACE(sizeof(int) * 4U)];
    rmsg.msg_control = rcontrol;
    rmsg.msg_controllen = sizeof(rcontrol);
    const ssize_t n = recvmsg(fd_, &rmsg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      continue;
    }
    if (n < 0) {
      return Lost(func, std::string("the attach connection to datadistd failed: ") + std::strerror(errno));
    }
    if (n == 0) {
      return Lost(func, "datadistd closed the attach connection");
    }
    std::vector<int> got;
    for (cmsghdr *cm = CMSG_FIRSTHDR(&rmsg); cm != nullptr; cm = CMSG_NXTHDR(&rmsg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int one;
          std::memcpy(&one, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
          got.push_back(one);
        }
      }
    }
    datadist::v1::AttachReply parsed;
    const bool ok = static_cast<unsigned char>(buf[0]) != 0xFFU && parsed.ParseFromArray(buf.data(), static_cast<int>(n));
    if (!ok || parsed.request_id() != rid) {  // a late reply to a request that timed out: nobody waits for it
      for (int f : got) {
        (void)close(f);
      }
      continue;
    }
    for (size_t i = 1; i < got.size(); ++i) {
      (void)close(got[i]);
    }
    if (parsed.status() != 0) {
      if (!got.empty()) {
        (void)close(got[0]);
      }
      return Fail(func, CodeToStatus(parsed.status()), parsed.message());
    }
    *fd_out = got.empty() ? -1 : got[0];
    *reply = std::move(parsed);
    return llm_datadist::LLM_SUCCESS;
  }
}

Status AttachClient::ImportMemory(const std::vector<int> &fds,
                                  const std::vector<std::pair<uint64_t, uint64_t>> &pieces, uint64_t offset,
                                  uint64_t length, const char *func, uint64_t *memory_id) {
  datadist::v1::AttachRequest req;
  auto *msg = req.mutable_import_memory();
  for (const auto &p : pieces) {
    auto *piece = msg->add_pieces();
    piece->set_file_offset(p.first);
    piece->set_length(p.second);
  }
  msg->set_offset(offset);
  msg->set_length(length);
  datadist::v1::AttachReply reply;
  int fd = -1;
  const Status st = Call(req, func, fds, 30000, &reply, &fd);
  if (fd >= 0) {
    (void)close(fd);
  }
  if (st == llm_datadist::LLM_SUCCESS) {
    *memory_id = reply.imported().memory_id();
  }
  return st;
}

Status AttachClient::ImportDeviceMemory(const std::string &key, int32_t device, uint64_t length, const char *func,
                                        uint64_t *memory_id) {
  datadist::v1::AttachRequest req;
  auto *msg = req.mutable_import_memory();
  msg->set_device_key(key);
  msg->set_device_id(device);
  msg->set_length(length);
  datadist::v1::AttachReply reply;
  int fd = -1;
  const Status st = Call(req, func, {}, 30000, &reply, &fd);
  if (fd >= 0) {
    (void)close(fd);
  }
  if (st == llm_datadist::LLM_SUCCESS) {
    *memory_id = reply.imported().memory_id();
  }
  return st;
}

void AttachClient::ReleaseMemory(const std::vector<uint64_t> &memory_ids) {
  for (uint64_t id : memory_ids) {
    datadist::v1::AttachRequest req;
    req.mutable_release_memory()->set_memory_id(id);
    datadist::v1::AttachReply reply;
    int fd = -1;
    if (Call(req, "release", {}, 30000, &reply, &fd) != llm_datadist::LLM_SUCCESS) {
      return;
    }
    if (fd >= 0) {
      (void)close(fd);
    }
  }
}

Status AttachClient::ExportPool(uint64_t engine_id, const std::string &pool, const char *func, int *fd,
                                uint64_t *size) {
  datadist::v1::AttachRequest req;
  req.mutable_export_pool()->set_engine_id(engine_id);
  req.mutable_export_pool()->set_pool(pool);
  datadist::v1::AttachReply reply;
  const Status st = Call(req, func, {}, 30000, &reply, fd);
  if (st != llm_datadist::LLM_SUCCESS) {
    return st;
  }
  if (!reply.pool().device_key().empty() || *fd < 0) {
    if (*fd >= 0) {
      (void)close(*fd);
      *fd = -1;
    }
    return Fail(func, llm_datadist::LLM_FEATURE_NOT_ENABLED,
                "the pool is NPU memory (memory backend acl): this library maps host pools only");
  }
  *size = reply.pool().size();
  return llm_datadist::LLM_SUCCESS;
}

bool AttachClient::TryTransfer(bool push, const datadist::v1::TransferRequest &request, const char *func,
                               int timeout_ms, Status *status) {
  datadist::v1::AttachRequest req;
  if (push) {
    *req.mutable_push() = request;
  } else {
    *req.mutable_pull() = request;
  }
  req.set_request_id(UINT64_MAX);  // the largest id: the size below holds for any real one
  if (protocol_ < 2U || req.ByteSizeLong() > kMaxDatagram) {
    return false;  // a daemon that takes no transfers here, or block lists too long for one datagram
  }
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return false;  // another thread of this engine is waiting for its reply here
  }
  datadist::v1::AttachReply reply;
  int fd = -1;
  *status = CallLocked(req, func, {}, timeout_ms, &reply, &fd);
  if (fd >= 0) {
    (void)close(fd);
  }
  return true;
}

}  // namespace datadist_cpp
