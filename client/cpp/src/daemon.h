// Private: reaching datadistd, for both APIs (llm_datadist::LlmDataDist and hixl::Hixl): which daemon (an option,
// else DATADIST_DAEMON, else a private one), its worker socket, the gRPC channel to it, and what a failed call says
// (the daemon's LLMStatusCode in the trailing metadata "datadist-status-code").
#ifndef DATADIST_CPP_DAEMON_H_
#define DATADIST_CPP_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

namespace datadist_cpp {

constexpr const char kDaemonOption[] = "datadist.daemon";
constexpr const char kDaemonEnv[] = "DATADIST_DAEMON";
constexpr const char kCapabilityKey[] = "datadist-capability";
constexpr const char kStatusKey[] = "datadist-status-code";

// The socket path a daemon address names, as proto/datadist/address.py's socket_path reads it: unix:///abs,
// unix:path or a plain path; "" for another scheme or no path.
std::string UnixPath(const std::string &target);

// Why nothing can serve the unix socket `path` ("" when something accepts connections on it).
std::string NobodyListens(const std::string &path);

// The gRPC channel to the daemon's worker socket `path` (no retries, short reconnect backoff, 256 MiB messages).
std::shared_ptr<grpc::Channel> OpenChannel(const std::string &path);

// A failed call's LLMStatusCode: the daemon's (trailing metadata), else LLM_TIMEOUT past the deadline, else
// LLM_FAILED; *why says what happened.
int64_t FailedCallCode(const grpc::ClientContext &ctx, const grpc::Status &st, std::string *why);

}  // namespace datadist_cpp

#endif  // DATADIST_CPP_DAEMON_H_
