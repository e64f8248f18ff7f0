// Private: the facts the C++ hixl::Hixl shares with the daemon and the Python hixl client -- a copy of
// proto/datadist/hixl.py (that file is the source; tests/cpp/test_cpp_hixl.py checks that both agree on every
// status code and on a list of engine strings): HIXL's status codes, their map from the daemon's LLMStatusCode,
// HIXL's notify limits, the extent layout, how an engine string parses and the cluster id it names.
#ifndef DATADIST_CPP_HIXL_WIRE_H_
#define DATADIST_CPP_HIXL_WIRE_H_

#include <cstdint>
#include <string>

#include "hixl/hixl_types.h"

namespace datadist_cpp {
namespace hixl_wire {

// HIXL's notify limits (hicann/hixl src/hixl/common/ctrl_msg.h): longer name or message: PARAM_INVALID
constexpr size_t kMaxNotifyNameLen = 1024U;
constexpr size_t kMaxNotifyMsgLen = 1024U;
constexpr size_t kMaxNotifyQueue = 4096U;
// bytes of one extent in ExtentTransferRequest.extents: u64 little-endian local_addr, remote_addr, len
constexpr size_t kExtentSize = 24U;

// The HIXL status a daemon LLMStatusCode value stands for (hixl.py hixl_status); every code not named there is
// FAILED.
hixl::Status HixlStatus(int64_t llm_code);

// A parsed engine string (hixl.py Engine): host an IP address (IPv6 without brackets, in Python's ipaddress form),
// port 0 (none: the engine only connects out) or 1..65535 (it listens there).
struct Engine {
  std::string host;
  uint32_t port = 0U;
  // "ip", "ip:port", "[ipv6]" or "[ipv6]:port": the form whose hash is the engine's cluster id
  std::string Canonical() const;
};

// `text` as HIXL takes a local or remote engine (hixl.py parse_engine): false with `why` otherwise.
bool ParseEngine(const std::string &text, Engine *out, std::string *why);

// FNV-1a 64 of the canonical string, top bit cleared, 0 -> 1 (hixl.py engine_cluster_id).
uint64_t EngineClusterId(const Engine &engine);

}  // namespace hixl_wire
}  // namespace datadist_cpp

#endif  // DATADIST_CPP_HIXL_WIRE_H_
