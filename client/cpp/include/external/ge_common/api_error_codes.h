/*
 * datadist's C++ client: the ge types CANN's public headers take from "external/ge_common/api_error_codes.h"
 * (CANN's llm_datadist/llm_datadist.h, llm_error_codes.h and hixl/hixl_types.h include it): ge::Status,
 * ge::SUCCESS, ge::FAILED and ge::AscendString. One declaration for both APIs, so hixl::AscendString and
 * llm_datadist::AscendString are the same type; libllm_datadist.so holds its one implementation (libcann_hixl.so
 * links it). No std::string inside: a program may be built with -D_GLIBCXX_USE_CXX11_ABI=0 (as CANN builds its
 * samples) or with the default ABI.
 */
#ifndef DATADIST_EXTERNAL_GE_COMMON_API_ERROR_CODES_H_
#define DATADIST_EXTERNAL_GE_COMMON_API_ERROR_CODES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
// CANN's HIXL samples (examples/cpp/hixl_example_d2rd.cpp, _d2rh.cpp, _d2rd_multiproc.cpp) write to std::cerr and
// include only <cstdio>, <cstring>, <string>, <vector>, acl/acl.h and hixl/hixl.h: CANN's header chain declares it
#include <iostream>

#define DATADIST_CPP_API __attribute__((visibility("default")))

namespace ge {
using Status = uint32_t;
constexpr Status SUCCESS = 0U;
constexpr Status FAILED = 0xFFFFFFFFU;

// A string owned by the library's code only (no std::string inside): safe across both libstdc++ ABIs.
class DATADIST_CPP_API AscendString {
 public:
  AscendString() = default;
  AscendString(const char *name);  // NOLINT(google-explicit-constructor): CANN's is implicit too
  AscendString(const char *name, size_t length);
  AscendString(const AscendString &other);
  AscendString(AscendString &&other) noexcept;
  AscendString &operator=(const AscendString &other);
  AscendString &operator=(AscendString &&other) noexcept;
  ~AscendString();

  const char *GetString() const;  // never nullptr ("" when empty)
  size_t GetLength() const;
  size_t Hash() const;
  // the position of the first occurrence of `ascend_string`, or size_t(-1) (std::string::npos)
  size_t Find(const AscendString &ascend_string) const;

  bool operator<(const AscendString &d) const;
  bool operator>(const AscendString &d) const;
  bool operator<=(const AscendString &d) const;
  bool operator>=(const AscendString &d) const;
  bool operator==(const AscendString &d) const;
  bool operator!=(const AscendString &d) const;

 private:
  char *data_ = nullptr;
  size_t length_ = 0U;
};
}  // namespace ge

namespace std {
template <>
struct hash<ge::AscendString> {
  size_t operator()(const ge::AscendString &s) const { return s.Hash(); }
};
}  // namespace std

#endif  // DATADIST_EXTERNAL_GE_COMMON_API_ERROR_CODES_H_
