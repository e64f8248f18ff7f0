// Private: status codes, the library's log, deadlines.
#ifndef DATADIST_CPP_COMMON_H_
#define DATADIST_CPP_COMMON_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "llm_datadist/llm_datadist.h"

namespace datadist_cpp {
using llm_datadist::Status;

// A daemon's numeric code as a ge::Status: the known LLMStatusCode values as they are, anything else
// LLM_FAILED (the Python client's code_2_status).
Status CodeToStatus(int64_t code);
const char *StatusName(Status status);

// The library's log: stderr, "[llm_datadist] LEVEL message". DATADIST_CPP_LOG=debug|info|warning|error (default
// warning) sets the least level written.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
void Log(LogLevel level, const std::string &message);

// "[func] failed, error code is NAME(value), why": logged as an error; returns status.
Status Fail(const char *func, Status status, const std::string &why);

// While one lives, Fail on its thread says `caller` where a daemon's message says `internal`: a name the caller
// never used (the blocks twin's BlocksCacheKey of a cache id) becomes the one it did. An empty `internal` does
// nothing. Nested ones stack: the newest one holds until it goes, then the one it hid holds again.
class FailWording {
 public:
  FailWording(std::string internal, std::string caller);
  ~FailWording();
  FailWording(const FailWording &) = delete;
  FailWording &operator=(const FailWording &) = delete;
  std::string Apply(const std::string &why) const;

 private:
  const std::string internal_;
  const std::string caller_;
  const FailWording *outer_;
};

using Clock = std::chrono::steady_clock;
}  // namespace datadist_cpp

#endif  // DATADIST_CPP_COMMON_H_
