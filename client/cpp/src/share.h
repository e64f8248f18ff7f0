// Private: registered memory of this process as file descriptors the daemon maps -- the Python client's
// client/llm_datadist/_memory.py `share`, in C++. Memory already in a MAP_SHARED mapping of a memfd or a /dev/shm
// file goes as that file; private anonymous read-write memory (new/malloc/mmap(MAP_PRIVATE|MAP_ANONYMOUS)) is
// RE-BACKED: its pages are copied into a sealed memfd mapped MAP_SHARED|MAP_FIXED over them, same address, same
// bytes; afterwards this process and the daemon see the same pages (zero copy). Limits as in docs/security.md:
// whole pages are re-backed (neighbours sharing the first or last page are shared too); a thread writing those
// pages while they are copied may lose that write; the pages stay shared memory until unmapped; a child of
// fork() shares them with the parent (the Python client's fork handler has no C++ counterpart here).
#ifndef DATADIST_CPP_SHARE_H_
#define DATADIST_CPP_SHARE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace datadist_cpp {

struct Shared {
  std::vector<int> fds;
  std::vector<std::pair<uint64_t, uint64_t>> pieces;  // (file_offset, length) of fds[i]
  uint64_t offset = 0U;
  uint64_t length = 0U;
  std::vector<int> own;  // descriptors opened for this call only
  void Close();
};

// false with `why` when the range cannot be handed over (not mapped, a file mapping, read-only, ...).
bool Share(uint64_t address, uint64_t length, Shared *out, std::string *why);

}  // namespace datadist_cpp

#endif  // DATADIST_CPP_SHARE_H_
