// ge::AscendString: a heap copy of the bytes, owned and freed by this library only (no std::string inside).
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>

#include "llm_datadist/llm_datadist.h"

namespace ge {
namespace {
char *Dup(const char *data, size_t length) {
  if (data == nullptr || length == 0U) {
    return nullptr;
  }
  char *copy = new (std::nothrow) char[length + 1U];
  if (copy == nullptr) {
    return nullptr;
  }
  std::memcpy(copy, data, length);
  copy[length] = '\0';
  return copy;
}

int Compare(const AscendString &a, const AscendString &b) {
  const size_t n = a.GetLength() < b.GetLength() ? a.GetLength() : b.GetLength();
  const int c = std::memcmp(a.GetString(), b.GetString(), n);
  if (c != 0) {
    return c;
  }
  return a.GetLength() < b.GetLength() ? -1 : (a.GetLength() > b.GetLength() ? 1 : 0);
}
}  // namespace

AscendString::AscendString(const char *name) : AscendString(name, name == nullptr ? 0U : std::strlen(name)) {}

AscendString::AscendString(const char *name, size_t length) : data_(Dup(name, length)) {
  length_ = data_ == nullptr ? 0U : length;
}

AscendString::AscendString(const AscendString &other) : data_(Dup(other.data_, other.length_)) {
  length_ = data_ == nullptr ? 0U : other.length_;
}

AscendString::AscendString(AscendString &&other) noexcept : data_(other.data_), length_(other.length_) {
  other.data_ = nullptr;
  other.length_ = 0U;
}

AscendString &AscendString::operator=(const AscendString &other) {
  if (this != &other) {
    char *copy = Dup(other.data_, other.length_);
    delete[] data_;
    data_ = copy;
    length_ = copy == nullptr ? 0U : other.length_;
  }
  return *this;
}

AscendString &AscendString::operator=(AscendString &&other) noexcept {
  if (this != &other) {
    delete[] data_;
    data_ = other.data_;
    length_ = other.length_;
    other.data_ = nullptr;
    other.length_ = 0U;
  }
  return *this;
}

AscendString::~AscendString() { delete[] data_; }

const char *AscendString::GetString() const { return data_ == nullptr ? "" : data_; }
size_t AscendString::GetLength() const { return length_; }
size_t AscendString::Hash() const { return std::hash<std::string>()(std::string(GetString(), length_)); }

size_t AscendString::Find(const AscendString &ascend_string) const {
  return std::string(GetString(), length_).find(std::string(ascend_string.GetString(), ascend_string.GetLength()));
}

bool AscendString::operator<(const AscendString &d) const { return Compare(*this, d) < 0; }
bool AscendString::operator>(const AscendString &d) const { return Compare(*this, d) > 0; }
bool AscendString::operator<=(const AscendString &d) const { return Compare(*this, d) <= 0; }
bool AscendString::operator>=(const AscendString &d) const { return Compare(*this, d) >= 0; }
bool AscendString::operator==(const AscendString &d) const { return Compare(*this, d) == 0; }
bool AscendString::operator!=(const AscendString &d) const { return Compare(*this, d) != 0; }
}  // namespace ge
