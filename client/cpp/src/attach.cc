#include "attach.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace datadist_cpp {
namespace {
constexpr uint32_t kProtocolVersion = 4U;  // identity, memory, and pulls/pushes as binary frames, continued
constexpr size_t kMaxDatagram = 64U << 10U;  // datadist/fastframe.py MAX_DATAGRAM
constexpr size_t kMaxFds = 16U;

// The transfer frames: proto/datadist/fastframe.py is the one definition of their layout (little-endian).
constexpr unsigned char kMagic = 0xFFU;
constexpr unsigned char kOpPull = 1U, kOpPush = 2U, kOpContinue = 3U;
constexpr unsigned char kKindExtents = 2U;   // fastframe.KIND_EXTENTS
constexpr unsigned char kSrcRange = 1U, kDstRange = 2U, kTimeout = 4U, kSrcOffset = 8U, kDstOffset = 16U,
                        kExclusive = 32U, kMore = 64U;
constexpr size_t kRequestHead = 144U;   // fastframe.REQUEST.size
constexpr size_t kContinueHead = 16U;   // fastframe.CONTINUATION.size
constexpr size_t kReplyHead = 48U;      // fastframe.REPLY.size
constexpr size_t kFirstRoom = (kMaxDatagram - kRequestHead) / 8U;
constexpr size_t kNextRoom = (kMaxDatagram - kContinueHead) / 8U;

void PutLe(std::string *out, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) {
    (*out)[at + i] = static_cast<char>((value >> (8U * i)) & 0xFFU);
  }
}

uint64_t GetLe(const std::string &in, size_t at, size_t width) {
  uint64_t value = 0;
  for (size_t i = 0; i < width; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8U * i);
  }
  return value;
}

void PutBlocks(std::string *out, size_t at, const std::vector<uint64_t> &numbers, size_t from, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    PutLe(out, at + 8U * i, numbers[from + i], 8U);
  }
}

// The datagrams of one transfer: `head` (a first frame's fixed fields, kRequestHead bytes, its flags without
// kMore) with request id `rid` and the numbers, as a whole frame or a first frame ("more follow") and continuation
// frames.
std::vector<std::string> Datagrams(uint64_t rid, std::string head, const std::vector<uint64_t> &numbers) {
  const bool more = numbers.size() > kFirstRoom;
  const size_t first = more ? kFirstRoom : numbers.size();
  if (more) {
    head[4] = static_cast<char>(static_cast<unsigned char>(head[4]) | kMore);
  }
  PutLe(&head, 8U, rid, 8U);
  head.resize(kRequestHead + 8U * first, '\0');
  PutBlocks(&head, kRequestHead, numbers, 0U, first);
  std::vector<std::string> out;
  out.push_back(std::move(head));
  for (size_t at = first; at < numbers.size(); at += kNextRoom) {
    const size_t count = std::min(kNextRoom, numbers.size() - at);
    std::string cont(kContinueHead + 8U * count, '\0');
    cont[0] = static_cast<char>(kMagic);
    cont[1] = static_cast<char>(kOpContinue);
    PutLe(&cont, 8U, rid, 8U);
    PutBlocks(&cont, kContinueHead, numbers, at, count);
    out.push_back(std::move(cont));
  }
  return out;
}

// The datagrams of one pull or push.
std::vector<std::string> EncodeFrames(uint64_t rid, bool push, const datadist::v1::TransferRequest &r) {
  std::vector<uint64_t> numbers(r.remote_blocks().begin(), r.remote_blocks().end());
  numbers.insert(numbers.end(), r.local_blocks().begin(), r.local_blocks().end());
  std::string head(kRequestHead, '\0');
  unsigned char key_kind = 0U;
  uint64_t key[4] = {0U, 0U, 0U, 0U};
  const auto &remote = r.remote();
  if (remote.has_cache_key()) {
    key_kind = 1U;
    key[0] = remote.cache_key().cluster_id();
    key[1] = remote.cache_key().req_id();
    key[2] = remote.cache_key().model_id();
    key[3] = remote.cache_key().prefix_id();
  } else if (remote.has_by_id()) {
    key_kind = 2U;
    key[0] = remote.by_id().cluster_id();
    key[1] = static_cast<uint64_t>(remote.by_id().cache_id());
    key[2] = remote.by_id().batch_index();
  } else if (remote.has_blocks_key()) {
    key_kind = 3U;
    key[0] = remote.blocks_key().cluster_id();
    key[1] = remote.blocks_key().model_id();
  }
  const unsigned char flags = static_cast<unsigned char>(
      (r.has_src_layer_range() ? kSrcRange : 0U) | (r.has_dst_layer_range() ? kDstRange : 0U) |
      (r.has_timeout_ms() ? kTimeout : 0U) | (r.has_src_cache_offset() ? kSrcOffset : 0U) |
      (r.has_dst_cache_offset() ? kDstOffset : 0U) | (r.exclusive() ? kExclusive : 0U));
  head[0] = static_cast<char>(kMagic);
  head[1] = static_cast<char>(push ? kOpPush : kOpPull);
  head[2] = static_cast<char>(r.kind());
  head[3] = static_cast<char>(key_kind);
  head[4] = static_cast<char>(flags);
  PutLe(&head, 16U, r.engine_id(), 8U);
  PutLe(&head, 24U, static_cast<uint64_t>(r.local_cache_id()), 8U);
  for (size_t i = 0; i < 4U; ++i) {
    PutLe(&head, 32U + 8U * i, key[i], 8U);
  }
  PutLe(&head, 64U, r.local_batch_index(), 4U);
  PutLe(&head, 68U, r.tensor_num_per_layer(), 4U);
  PutLe(&head, 72U, static_cast<uint64_t>(r.size()), 8U);
  PutLe(&head, 80U, static_cast<uint64_t>(r.src_layer_range().start()), 8U);
  PutLe(&head, 88U, static_cast<uint64_t>(r.src_layer_range().stop()), 8U);
  PutLe(&head, 96U, static_cast<uint64_t>(r.dst_layer_range().start()), 8U);
  PutLe(&head, 104U, static_cast<uint64_t>(r.dst_layer_range().stop()), 8U);
  PutLe(&head, 112U, r.timeout_ms(), 4U);
  PutLe(&head, 120U, r.src_cache_offset(), 8U);
  PutLe(&head, 128U, r.dst_cache_offset(), 8U);
  PutLe(&head, 136U, static_cast<uint64_t>(r.remote_blocks_size()), 4U);
  PutLe(&head, 140U, static_cast<uint64_t>(r.local_blocks_size()), 4U);
  return Datagrams(rid, std::move(head), numbers);
}

// The datagrams of HIXL's extents (fastframe KIND_EXTENTS): READ as a pull, WRITE as a push; key kind 0, the
// remote engine's cluster in the key, size -1, the extents as the remote numbers (three each), a timeout.
std::vector<std::string> EncodeExtentFrames(uint64_t rid, bool write, uint64_t engine_id, uint64_t cluster,
                                            const std::vector<uint64_t> &numbers, uint32_t timeout_ms) {
  std::string head(kRequestHead, '\0');
  head[0] = static_cast<char>(kMagic);
  head[1] = static_cast<char>(write ? kOpPush : kOpPull);
  head[2] = static_cast<char>(kKindExtents);
  head[4] = static_cast<char>(kTimeout);
  PutLe(&head, 16U, engine_id, 8U);
  PutLe(&head, 32U, cluster, 8U);
  PutLe(&head, 72U, ~0ULL, 8U);   // size -1
  PutLe(&head, 112U, timeout_ms, 4U);
  PutLe(&head, 136U, numbers.size(), 4U);
  return Datagrams(rid, std::move(head), numbers);
}

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// DirectoryCulprit along `d` and its parents as named: each entry judged by who made it (lstat: a symbolic link's
// owner) and by the directory it names (stat: a link's target, where the names below it are made).
std::string WalkCulprit(std::string d, uid_t uid, bool given) {
  std::string below;  // the directory just below d on the way up ("": the socket itself)
  uid_t below_uid = uid;
  for (;;) {
    struct stat entry {};
    struct stat st {};
    if (lstat(d.c_str(), &entry) != 0 || (S_ISLNK(entry.st_mode) ? stat(d.c_str(), &st) : (st = entry, 0)) != 0) {
      return d + " cannot be looked at (" + std::strerror(errno) + ")";
    }
    if (S_ISLNK(entry.st_mode) && entry.st_uid != uid && entry.st_uid != 0) {
      return d + " is a link owned by uid " + std::to_string(entry.st_uid);
    }
    const bool writable_by_others = (st.st_mode & 0022) != 0;
    const bool sticky_root = st.st_uid == 0 && (st.st_mode & 01000) != 0;
    if ((st.st_uid != uid && st.st_uid != 0) || (writable_by_others && !sticky_root)) {
      char mode[16];
      std::snprintf(mode, sizeof(mode), "%#o", static_cast<unsigned>(st.st_mode & 07777));
      return d + " is owned by uid " + std::to_string(st.st_uid) + " with mode " + mode;
    }
    if (given && writable_by_others && below_uid != 0) {
      const std::string what = below.empty() ? "the socket" : below + " of uid " + std::to_string(below_uid);
      return what + " is inside " + d + ", where every user may create names";
    }
    if (d == "/") {
      return "";
    }
    below = d;
    below_uid = entry.st_uid;
    const size_t slash = d.rfind('/');
    d = slash == 0 ? "/" : d.substr(0, slash);
  }
}

// `path` made absolute and normalised without looking at the file system (os.path.abspath).
std::string AbsPath(const std::string &path) {
  std::string whole = path;
  if (whole.empty() || whole[0] != '/') {
    char *cwd = getcwd(nullptr, 0);
    whole = std::string(cwd != nullptr ? cwd : "") + "/" + whole;
    free(cwd);
  }
  std::vector<std::string> parts;
  size_t at = 0;
  while (at <= whole.size()) {
    size_t next = whole.find('/', at);
    if (next == std::string::npos) next = whole.size();
    const std::string part = whole.substr(at, next - at);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    at = next + 1;
  }
  std::string out;
  for (const std::string &part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

// Why `directory` is not safe for the sockets of `uid`, "" when it is: proto/datadist/sockdir.py `culprit` (the
// daemon's own rule for its socket directory; with `given`, also no directory of `uid` right inside one every user
// may create names in, such as /tmp), along the path as named and the path it resolves to: a link another user made
// in /tmp does not pass because its target would. One place in C++: the Python client and the daemon share the
// Python one.
std::string DirectoryCulprit(const std::string &directory, uid_t uid, bool given) {
  char *resolved = realpath(directory.c_str(), nullptr);
  if (resolved == nullptr) {
    return directory + " cannot be looked at (" + std::strerror(errno) + ")";
  }
  const std::string real = resolved;
  free(resolved);
  const std::string named = AbsPath(directory);
  const std::string why = named != real ? WalkCulprit(named, uid, given) : "";
  return why.empty() ? WalkCulprit(real, uid, given) : why;
}

// LLM_FAILED, saying why and what to do, unless the attach socket `path` is in a directory only the uid serving it
// (the kernel's word) and root could have made (DirectoryCulprit; `given` for a uid neither ours nor root's): checked
// before a byte is sent.
Status CheckDaemonUid(const std::string &path, uid_t uid) {
  const uid_t me = geteuid();
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string why = DirectoryCulprit(directory, uid, uid != me && uid != 0);
  if (why.empty()) {
    return llm_datadist::LLM_SUCCESS;
  }
  return Fail("Initialize", llm_datadist::LLM_FAILED,
              "refusing the daemon socket " + path + ": it is served by uid " + std::to_string(uid) +
                  " (this process is uid " + std::to_string(me) +
                  ") and its directory is not one only that uid and root could have made (" + why +
                  "); another user may have made it to receive this worker's memory and calls, so nothing was sent. "
                  "Fix: remove the directory (as root or its owner) and start the daemon again, or run a shared "
                  "daemon with a socket directory root made for it (systemd's RuntimeDirectory=, /run/datadist) and "
                  "point DATADIST_DAEMON at it");
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
  // the kernel's word on who serves the socket, checked before a byte -- let alone memory -- is sent
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    const int err = errno;
    (void)close(fd);
    return Fail("Initialize", llm_datadist::LLM_FAILED,
                "cannot tell who serves " + path + " (SO_PEERCRED: " + std::strerror(err) + ")");
  }
  const Status trusted = CheckDaemonUid(path, cred.uid);
  if (trusted != llm_datadist::LLM_SUCCESS) {
    (void)close(fd);
    return trusted;
  }
  daemon_pid_ = cred.pid;
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
  if (reply.welcome().protocol_version() < kProtocolVersion) {
    Close();
    return Fail("Initialize", llm_datadist::LLM_FAILED,
                "datadistd at " + path + " speaks attach protocol " +
                    std::to_string(reply.welcome().protocol_version()) + ", this client " +
                    std::to_string(kProtocolVersion) + ": update datadistd");
  }
  capability_ = reply.welcome().capability();
  capability_hex_ = Hex(capability_);
  // ... as the NPU driver knows it (its word where PID namespaces differ; the kernel's where it sends none)
  daemon_tgid_ = reply.welcome().bare_tgid() > 0 ? reply.welcome().bare_tgid() : daemon_pid_;
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
  Status st = SendLocked({data}, fds, func);
  if (st != llm_datadist::LLM_SUCCESS) {
    return st;
  }
  size_t n = 0;
  std::vector<int> got;
  st = ReceiveLocked(rid, false, deadline, func, &n, &got);
  if (st != llm_datadist::LLM_SUCCESS) {
    return st;
  }
  datadist::v1::AttachReply parsed;
  (void)parsed.ParseFromArray(buf_.data(), static_cast<int>(n));  // parsed once already: it matched rid
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

Status AttachClient::SendLocked(const std::vector<std::string> &datagrams, const std::vector<int> &fds,
                                const char *func) {
  if (!broken_.empty() || fd_ < 0) {
    return Fail(func, llm_datadist::LLM_FAILED, broken_.empty() ? "not attached to datadistd" : broken_);
  }
  for (size_t d = 0; d < datagrams.size(); ++d) {
    const std::string &data = datagrams[d];
    iovec iov{const_cast<char *>(data.data()), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (d == 0U && !fds.empty()) {
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
  }
  return llm_datadist::LLM_SUCCESS;
}

Status AttachClient::ReceiveLocked(uint64_t rid, bool frame, Clock::time_point deadline, const char *func, size_t *n,
                                   std::vector<int> *got) {
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
    const ssize_t r = recvmsg(fd_, &rmsg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      continue;
    }
    if (r < 0) {
      return Lost(func, std::string("the attach connection to datadistd failed: ") + std::strerror(errno));
    }
    if (r == 0) {
      return Lost(func, "datadistd closed the attach connection");
    }
    got->clear();
    for (cmsghdr *cm = CMSG_FIRSTHDR(&rmsg); cm != nullptr; cm = CMSG_NXTHDR(&rmsg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int one;
          std::memcpy(&one, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
          got->push_back(one);
        }
      }
    }
    const size_t size = static_cast<size_t>(r);
    bool ours = false;
    if (static_cast<unsigned char>(buf[0]) == kMagic) {
      ours = frame && size >= kReplyHead && GetLe(buf, 8U, 8U) == rid;
    } else if (!frame) {
      datadist::v1::AttachReply parsed;
      ours = parsed.ParseFromArray(buf.data(), static_cast<int>(size)) && parsed.request_id() == rid;
    }
    if (!ours) {  // a late reply to a request that timed out: nobody waits for it
      for (int f : *got) {
        (void)close(f);
      }
      continue;
    }
    *n = size;
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

Status AttachClient::ExportPool(uint64_t engine_id, const std::string &pool, const char *func, int32_t bare_tgid,
                                int *fd, uint64_t *size, std::string *device_key, int32_t *device_id) {
  datadist::v1::AttachRequest req;
  req.mutable_export_pool()->set_engine_id(engine_id);
  req.mutable_export_pool()->set_pool(pool);
  req.mutable_export_pool()->set_bare_tgid(bare_tgid);
  datadist::v1::AttachReply reply;
  const Status st = Call(req, func, {}, 30000, &reply, fd);
  if (st != llm_datadist::LLM_SUCCESS) {
    return st;
  }
  if (!reply.pool().device_key().empty()) {  // NPU memory: imported by key (npu.cc ImportDevicePool)
    if (*fd >= 0) {
      (void)close(*fd);
      *fd = -1;
    }
    *device_key = reply.pool().device_key();
    *device_id = static_cast<int32_t>(reply.pool().device_id());
    *size = reply.pool().size();
    return llm_datadist::LLM_SUCCESS;
  }
  if (*fd < 0) {
    return Fail(func, llm_datadist::LLM_FAILED, "datadistd sent no descriptor for the pool");
  }
  *size = reply.pool().size();
  return llm_datadist::LLM_SUCCESS;
}

bool AttachClient::TryTransfer(bool push, const datadist::v1::TransferRequest &request, const char *func,
                               int timeout_ms, Status *status) {
  return TryFrames([&](uint64_t rid) { return EncodeFrames(rid, push, request); }, func, timeout_ms, status);
}

bool AttachClient::TryExtents(bool write, uint64_t engine_id, uint64_t cluster, const std::vector<uint64_t> &numbers,
                              const char *func, int timeout_ms, Status *status) {
  return TryFrames([&](uint64_t rid) {
    return EncodeExtentFrames(rid, write, engine_id, cluster, numbers, static_cast<uint32_t>(timeout_ms));
  }, func, timeout_ms, status);
}

bool AttachClient::TryFrames(const std::function<std::vector<std::string>(uint64_t)> &frames, const char *func,
                             int timeout_ms, Status *status) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    return false;  // another thread of this engine is waiting for its reply here
  }
  const uint64_t rid = next_id_++;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  *status = SendLocked(frames(rid), {}, func);
  if (*status != llm_datadist::LLM_SUCCESS) {
    return true;
  }
  size_t n = 0;
  std::vector<int> got;
  *status = ReceiveLocked(rid, true, deadline, func, &n, &got);
  for (int f : got) {
    (void)close(f);
  }
  if (*status != llm_datadist::LLM_SUCCESS) {
    return true;
  }
  const int64_t code = static_cast<int64_t>(GetLe(buf_, 16U, 8U));
  if (code != 0) {
    *status = Fail(func, CodeToStatus(code), buf_.substr(kReplyHead, n - kReplyHead));
  }
  return true;
}

}  // namespace datadist_cpp
