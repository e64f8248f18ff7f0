#include "daemon.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace datadist_cpp {

std::string UnixPath(const std::string &target) {
  std::string rest = target;
  if (rest.rfind("unix:", 0) == 0) {
    rest = rest.substr(5);
    if (rest.rfind("//", 0) == 0) rest = rest.substr(2);
  } else if (rest.find("://") != std::string::npos) {
    return "";
  }
  return rest;
}

std::string NobodyListens(const std::string &path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return "the socket path is too long";
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1U);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  std::string why;
  if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
    if (errno == ENOENT) why = "there is no socket file " + path;
    else if (errno == ECONNREFUSED) why = "nothing listens on " + path + " (a daemon that stopped left it)";
    else if (errno == EACCES) why = "this user may not connect to " + path + " (is it in the daemon's group?)";
  }
  (void)close(fd);
  return why;
}

std::shared_ptr<grpc::Channel> OpenChannel(const std::string &path) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
}

int64_t FailedCallCode(const grpc::ClientContext &ctx, const grpc::Status &st, std::string *why) {
  constexpr int64_t kFailed = 0xFFFFFFFFLL, kTimeout = 0x5010B01ALL;
  for (const auto &kv : ctx.GetServerTrailingMetadata()) {
    if (std::string(kv.first.data(), kv.first.size()) == kStatusKey) {
      const std::string value(kv.second.data(), kv.second.size());
      char *end = nullptr;
      const long long code = std::strtoll(value.c_str(), &end, 10);
      if (end != nullptr && *end == '\0' && !value.empty()) {
        *why = st.error_message();
        return code;
      }
    }
  }
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    *why = "the daemon did not answer in time (" + st.error_message() + ")";
    return kTimeout;
  }
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    *why = "datadistd is not reachable (" + st.error_message() + "); is it running?";
    return kFailed;
  }
  *why = "gRPC status " + std::to_string(static_cast<int>(st.error_code())) + ": " + st.error_message();
  return kFailed;
}

}  // namespace datadist_cpp
