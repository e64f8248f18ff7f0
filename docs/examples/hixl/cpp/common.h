// Shared by server.cpp and client.cpp: the buffer the client moves, what it holds, and how a call's status shows.
#ifndef DATADIST_EXAMPLES_HIXL_CPP_COMMON_H_
#define DATADIST_EXAMPLES_HIXL_CPP_COMMON_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hixl/hixl.h"

namespace example {
using namespace hixl;

constexpr size_t kBufSize = 1U << 20;  // the server's buffer: 1 MiB of host memory ...
constexpr size_t kBlock = 4096U;       // ... that the client moves in extents of 4 KiB
constexpr size_t kBlocks = kBufSize / kBlock;

// What the server's buffer holds: byte i is i mod 251 (a prime: no two blocks are alike).
inline uint8_t Pattern(size_t i) { return static_cast<uint8_t>(i % 251U); }

inline const char *StatusName(Status ret) {
  switch (ret) {
    case SUCCESS: return "SUCCESS";
    case PARAM_INVALID: return "PARAM_INVALID";
    case TIMEOUT: return "TIMEOUT";
    case NOT_CONNECTED: return "NOT_CONNECTED";
    case ALREADY_CONNECTED: return "ALREADY_CONNECTED";
    case NOTIFY_FAILED: return "NOTIFY_FAILED";
    case UNSUPPORTED: return "UNSUPPORTED";
    case FAILED: return "FAILED";
    case RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    default: return "an unknown status";
  }
}

// Print `what` with the status it returned; exit with status 1 unless it is SUCCESS.
inline void Check(const char *who, Status ret, const std::string &what) {
  if (ret != SUCCESS) {
    std::printf("%s: %s failed: %s\n", who, what.c_str(), StatusName(ret));
    std::exit(EXIT_FAILURE);
  }
  std::printf("%s: %s: %s\n", who, what.c_str(), StatusName(ret));
  std::fflush(stdout);
}
}  // namespace example

#endif  // DATADIST_EXAMPLES_HIXL_CPP_COMMON_H_
