#include "common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

namespace datadist_cpp {
namespace {
struct Named {
  Status value;
  const char *name;
};
constexpr uint32_t kBase = 0x5010B000U;
const Named kCodes[] = {
    {0U, "LLM_SUCCESS"},
    {0xFFFFFFFFU, "LLM_FAILED"},
    {kBase + 0x01U, "LLM_WAIT_PROC_TIMEOUT"},
    {kBase + 0x02U, "LLM_KV_CACHE_NOT_EXIST"},
    {kBase + 0x03U, "LLM_REPEAT_REQUEST"},
    {kBase + 0x04U, "LLM_REQUEST_ALREADY_COMPLETED"},
    {kBase + 0x05U, "LLM_PARAM_INVALID"},
    {kBase + 0x06U, "LLM_ENGINE_FINALIZED"},
    {kBase + 0x07U, "LLM_NOT_YET_LINK"},
    {kBase + 0x08U, "LLM_ALREADY_LINK"},
    {kBase + 0x09U, "LLM_LINK_FAILED"},
    {kBase + 0x0AU, "LLM_UNLINK_FAILED"},
    {kBase + 0x0BU, "LLM_NOTIFY_PROMPT_UNLINK_FAILED"},
    {kBase + 0x0CU, "LLM_CLUSTER_NUM_EXCEED_LIMIT"},
    {kBase + 0x0DU, "LLM_PROCESSING_LINK"},
    {kBase + 0x0EU, "LLM_DEVICE_OUT_OF_MEMORY"},
    {kBase + 0x0FU, "LLM_PREFIX_ALREADY_EXIST"},
    {kBase + 0x10U, "LLM_PREFIX_NOT_EXIST"},
    {kBase + 0x11U, "LLM_SEQ_LEN_OVER_LIMIT"},
    {kBase + 0x12U, "LLM_NO_FREE_BLOCK"},
    {kBase + 0x13U, "LLM_BLOCKS_OUT_OF_MEMORY"},
    {kBase + 0x18U, "LLM_EXIST_LINK"},
    {kBase + 0x19U, "LLM_FEATURE_NOT_ENABLED"},
    {kBase + 0x1AU, "LLM_TIMEOUT"},
    {kBase + 0x1BU, "LLM_LINK_BUSY"},
    {kBase + 0x1CU, "LLM_OUT_OF_MEMORY"},
    {507053U, "LLM_DEVICE_MEM_ERROR"},
    {507057U, "LLM_SUSPECT_REMOTE_ERROR"},
};

LogLevel Threshold() {
  static const LogLevel level = [] {
    const char *env = std::getenv("DATADIST_CPP_LOG");
    if (env == nullptr) {
      return LogLevel::kWarning;
    }
    if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
    if (std::strcmp(env, "info") == 0) return LogLevel::kInfo;
    if (std::strcmp(env, "error") == 0) return LogLevel::kError;
    return LogLevel::kWarning;
  }();
  return level;
}
}  // namespace

Status CodeToStatus(int64_t code) {
  if (code < 0 || code > 0xFFFFFFFFLL) {
    return llm_datadist::LLM_FAILED;
  }
  for (const Named &n : kCodes) {
    if (n.value == static_cast<Status>(code)) {
      return n.value;
    }
  }
  return llm_datadist::LLM_FAILED;
}

const char *StatusName(Status status) {
  for (const Named &n : kCodes) {
    if (n.value == status) {
      return n.name;
    }
  }
  return "LLM_UNKNOWN";
}

void Log(LogLevel level, const std::string &message) {
  if (level < Threshold()) {
    return;
  }
  static std::mutex mu;
  static const char *const kNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[llm_datadist] %s %d %s\n", kNames[static_cast<int>(level)], static_cast<int>(getpid()),
               message.c_str());
  std::fflush(stderr);
}

namespace {
thread_local const FailWording *g_wording = nullptr;  // the thread's newest FailWording
}  // namespace

FailWording::FailWording(std::string internal, std::string caller)
    : internal_(std::move(internal)), caller_(std::move(caller)), outer_(g_wording) {
  g_wording = this;
}

FailWording::~FailWording() { g_wording = outer_; }

std::string FailWording::Apply(const std::string &why) const {
  if (internal_.empty()) return why;
  std::string out = why;
  for (size_t at = out.find(internal_); at != std::string::npos; at = out.find(internal_, at + caller_.size())) {
    out.replace(at, internal_.size(), caller_);
  }
  return out;
}

Status Fail(const char *func, Status status, const std::string &why) {
  char code[64];
  std::snprintf(code, sizeof(code), "%s(0x%X)", StatusName(status), status);
  Log(LogLevel::kError, std::string("[") + func + "] failed, error code is " + code + ", " +
                            (g_wording != nullptr ? g_wording->Apply(why) : why));
  return status;
}
}  // namespace datadist_cpp
