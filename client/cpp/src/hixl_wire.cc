// proto/datadist/hixl.py in C++ (hixl_wire.h).
#include "hixl_wire.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

namespace datadist_cpp {
namespace hixl_wire {
namespace {
struct Mapped {
  int64_t llm;
  hixl::Status hixl;
};
// hixl.py _MAP, by LLMStatusCode value (datadist.status)
constexpr Mapped kMap[] = {
    {0x0, hixl::SUCCESS},                      // LLM_SUCCESS
    {0x5010B005, hixl::PARAM_INVALID},         // LLM_PARAM_INVALID
    {0x5010B002, hixl::PARAM_INVALID},         // LLM_KV_CACHE_NOT_EXIST
    {0x5010B01A, hixl::TIMEOUT},               // LLM_TIMEOUT
    {0x5010B001, hixl::TIMEOUT},               // LLM_WAIT_PROCESS_TIMEOUT
    {0x5010B007, hixl::NOT_CONNECTED},         // LLM_NOT_YET_LINK
    {0x5010B008, hixl::ALREADY_CONNECTED},     // LLM_ALREADY_LINK
    {0x5010B018, hixl::ALREADY_CONNECTED},     // LLM_EXIST_LINK
    {0x5010B019, hixl::UNSUPPORTED},           // LLM_FEATURE_NOT_ENABLED
    {0x5010B01C, hixl::RESOURCE_EXHAUSTED},    // LLM_OUT_OF_MEMORY
    {0x5010B00E, hixl::RESOURCE_EXHAUSTED},    // LLM_DEVICE_OUT_OF_MEMORY
    {0x5010B013, hixl::RESOURCE_EXHAUSTED},    // LLM_BLOCKS_OUT_OF_MEMORY
    {0x5010B00C, hixl::RESOURCE_EXHAUSTED},    // LLM_CLUSTER_NUM_EXCEED_LIMIT
};

bool Digits(const std::string &s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Python's str(ipaddress.IPv6Address): lowercase hextets without leading zeros, the longest run (the first of
// equal ones) of two or more zero hextets as "::" (Python 3.11's form: an IPv4-mapped address in hextets too)
std::string Ipv6Text(const unsigned char bytes[16]) {
  uint16_t h[8];
  for (int i = 0; i < 8; ++i) h[i] = static_cast<uint16_t>(bytes[2 * i] << 8 | bytes[2 * i + 1]);
  int best = -1, best_len = 0;
  for (int i = 0; i < 8;) {
    if (h[i] != 0) {
      ++i;
      continue;
    }
    int j = i;
    while (j < 8 && h[j] == 0) ++j;
    if (j - i > best_len) {
      best = i;
      best_len = j - i;
    }
    i = j;
  }
  if (best_len < 2) best = -1;
  std::string out;
  char part[8];
  for (int i = 0; i < 8; ++i) {
    if (i == best) {
      out += i == 0 ? "::" : ":";
      i += best_len - 1;
      continue;
    }
    std::snprintf(part, sizeof(part), "%x", h[i]);
    out += part;
    if (i < 7) out += ":";
  }
  return out;
}

// ipaddress.ip_address(host): IPv4 first, then IPv6 (with a "%scope" suffix kept as given)
bool ParseIp(const std::string &host, std::string *canonical, bool *v6) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, host.c_str(), buf) == 1) {
    char text[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, buf, text, sizeof(text)) == nullptr) return false;
    *canonical = text;
    *v6 = false;
    return true;
  }
  const size_t pct = host.find('%');
  const std::string addr = host.substr(0, pct);
  std::string scope;
  if (pct != std::string::npos) {
    scope = host.substr(pct + 1);
    if (scope.empty() || scope.find('%') != std::string::npos) return false;
  }
  if (inet_pton(AF_INET6, addr.c_str(), buf) != 1) return false;
  *canonical = Ipv6Text(buf) + (pct != std::string::npos ? "%" + scope : "");
  *v6 = true;
  return true;
}

std::string Quote(const std::string &s) { return "'" + s + "'"; }
}  // namespace

hixl::Status HixlStatus(int64_t llm_code) {
  for (const Mapped &m : kMap) {
    if (m.llm == llm_code) return m.hixl;
  }
  return hixl::FAILED;
}

std::string Engine::Canonical() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return port != 0U ? h + ":" + std::to_string(port) : h;
}

bool ParseEngine(const std::string &text, Engine *out, std::string *why) {
  const std::string shown = "engine " + Quote(text);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front())) ||
      std::isspace(static_cast<unsigned char>(text.back()))) {
    *why = shown + ": expected 'ip', 'ip:port', '[ipv6]' or '[ipv6]:port'";
    return false;
  }
  std::string host, port_text;
  const bool bracket = text[0] == '[';
  if (bracket) {
    const size_t end = text.find(']');
    if (end == std::string::npos || (end + 1 < text.size() && text[end + 1] != ':')) {
      *why = shown + ": an IPv6 engine is '[ipv6]' or '[ipv6]:port'";
      return false;
    }
    host = text.substr(1, end - 1);
    port_text = end + 1 < text.size() ? text.substr(end + 2) : "";
    if (end + 1 < text.size() && port_text.empty()) {
      *why = shown + ": no port after ':'";
      return false;
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    const size_t colon = text.find(':');
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (port_text.empty()) {
      *why = shown + ": no port after ':'";
      return false;
    }
  } else {
    host = text;
  }
  std::string canonical;
  bool v6 = false;
  if (!ParseIp(host, &canonical, &v6)) {
    *why = shown + ": " + Quote(host) + " is not an IP address";
    return false;
  }
  if (v6 && !bracket) {
    *why = shown + ": write an IPv6 engine as '[" + host + "]' or '[" + host + "]:port'";
    return false;
  }
  uint32_t port = 0U;
  if (!port_text.empty()) {
    uint64_t value = 0U;
    for (char c : port_text) value = std::min<uint64_t>(value * 10U + static_cast<uint64_t>(c - '0'), 1000000U);
    if (!Digits(port_text) || value > 65535U) {
      *why = shown + ": port " + Quote(port_text) + " is not in 0..65535";
      return false;
    }
    port = static_cast<uint32_t>(value);
  }
  out->host = canonical;
  out->port = port;
  return true;
}

uint64_t EngineClusterId(const Engine &engine) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : engine.Canonical()) {
    h = (h ^ c) * 0x100000001B3ULL;
  }
  h &= (1ULL << 63) - 1U;
  return h != 0U ? h : 1U;
}

}  // namespace hixl_wire
}  // namespace datadist_cpp
