#include "share.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace datadist_cpp {
namespace {
constexpr size_t kMaxPieces = 16U;

struct Region {
  uint64_t start = 0U;
  uint64_t end = 0U;
  std::string perms;
  uint64_t offset = 0U;
  unsigned dev_major = 0U;
  unsigned dev_minor = 0U;
  uint64_t inode = 0U;
  std::string path;

  bool Shareable() const {
    if (perms.size() < 4U || perms[3] != 's' || inode == 0U) {
      return false;
    }
    return path.rfind("/dev/shm/", 0) == 0 || path.rfind("/memfd:", 0) == 0;
  }
  bool Anonymous() const {
    return perms.size() >= 4U && perms.compare(0, 2, "rw") == 0 && perms[3] == 'p' && inode == 0U &&
           (path.empty() || path == "[heap]" || path.rfind("[anon:", 0) == 0);
  }
  bool Deleted() const {
    static const std::string kDeleted = " (deleted)";
    return path.size() >= kDeleted.size() && path.compare(path.size() - kDeleted.size(), kDeleted.size(), kDeleted) == 0;
  }
};

using FileKey = std::tuple<unsigned, unsigned, uint64_t>;
std::mutex g_mu;
std::map<FileKey, int> g_rebacked;  // our memfds, kept open: later registrations of the same pages send them again

std::vector<Region> Regions() {
  std::vector<Region> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Region r;
    char perms[8] = {0};
    unsigned long long lo = 0, hi = 0, off = 0, ino = 0;
    unsigned maj = 0, min = 0;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu %n", &lo, &hi, perms, &off, &maj, &min, &ino,
                    &consumed) < 7) {
      continue;
    }
    r.start = lo;
    r.end = hi;
    r.perms = perms;
    r.offset = off;
    r.dev_major = maj;
    r.dev_minor = min;
    r.inode = ino;
    r.path = consumed > 0 && static_cast<size_t>(consumed) <= line.size() ? line.substr(consumed) : "";
    out.push_back(r);
  }
  return out;
}

void ForgetUnmapped(const std::vector<Region> &regions) {
  for (auto it = g_rebacked.begin(); it != g_rebacked.end();) {
    bool live = false;
    for (const Region &r : regions) {
      if (FileKey(r.dev_major, r.dev_minor, r.inode) == it->first) {
        live = true;
        break;
      }
    }
    if (live) {
      ++it;
    } else {
      (void)close(it->second);
      it = g_rebacked.erase(it);
    }
  }
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DATADIST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DATADIST_ASAN 1
#endif

// Copies whole pages of this process. Under AddressSanitizer (make cpp-asan) the pages hold, by design, bytes it has
// poisoned (a neighbour's redzone or freed block sharing the first or last page), so the copy is a loop it does not
// watch (volatile: never turned into a memcpy call it intercepts); otherwise memcpy.
#ifdef DATADIST_ASAN
__attribute__((no_sanitize("address"))) void CopyPages(void *dst, const void *src, size_t n) {
  auto *to = static_cast<volatile uint64_t *>(dst);
  const auto *from = static_cast<const volatile uint64_t *>(src);
  for (size_t i = 0; i < n / sizeof(uint64_t); ++i) {
    to[i] = from[i];
  }
}
#else
void CopyPages(void *dst, const void *src, size_t n) { std::memcpy(dst, src, n); }
#endif

// Replace the private pages [lo, hi) by a sealed memfd holding the same bytes, at the same address.
int Reback(uint64_t lo, uint64_t hi, std::string *why) {
  const size_t n = hi - lo;
  int fd = memfd_create("datadist-registered", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *why = std::string("memfd_create: ") + std::strerror(errno);
    return -1;
  }
  if (ftruncate(fd, static_cast<off_t>(n)) != 0) {
    *why = std::string("ftruncate: ") + std::strerror(errno);
    (void)close(fd);
    return -1;
  }
  void *tmp = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) {
    *why = std::string("mmap: ") + std::strerror(errno);
    (void)close(fd);
    return -1;
  }
  CopyPages(tmp, reinterpret_cast<const void *>(lo), n);
  void *res = mmap(reinterpret_cast<void *>(lo), n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  const int err = errno;
  (void)munmap(tmp, n);
  if (res == MAP_FAILED) {
    *why = std::string("cannot re-back the memory with shared memory: ") + std::strerror(err);
    (void)close(fd);
    return -1;
  }
  (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  struct stat st {};
  if (fstat(fd, &st) == 0) {
    g_rebacked[FileKey(major(st.st_dev), minor(st.st_dev), st.st_ino)] = fd;
  }
  return fd;
}

int FdOf(const Region &r, std::vector<int> *own, std::string *why) {
  auto it = g_rebacked.find(FileKey(r.dev_major, r.dev_minor, r.inode));
  if (it != g_rebacked.end()) {
    return it->second;
  }
  if (r.path.rfind("/dev/shm/", 0) == 0 && !r.Deleted()) {
    int fd = open(r.path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      own->push_back(fd);
      return fd;
    }
  }
  DIR *dir = opendir("/proc/self/fd");
  if (dir != nullptr) {
    while (dirent *e = readdir(dir)) {
      if (e->d_name[0] == '.') {
        continue;
      }
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      struct stat st {};
      if (stat(link.c_str(), &st) != 0) {
        continue;
      }
      if (st.st_ino == r.inode && major(st.st_dev) == r.dev_major && minor(st.st_dev) == r.dev_minor) {
        int fd = open(link.c_str(), O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
          closedir(dir);
          own->push_back(fd);
          return fd;
        }
      }
    }
    closedir(dir);
  }
  *why = "the memory is a shared mapping of " + r.path +
         ", but this process holds no descriptor of it any more; keep the memfd open while it is registered";
  return -1;
}

void Add(Shared *out, int fd, uint64_t file_offset, uint64_t length) {
  if (!out->fds.empty() && out->fds.back() == fd &&
      out->pieces.back().first + out->pieces.back().second == file_offset) {
    out->pieces.back().second += length;
    return;
  }
  out->fds.push_back(fd);
  out->pieces.emplace_back(file_offset, length);
}

std::string HexAddr(uint64_t a) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}
}  // namespace

void Shared::Close() {
  for (int fd : own) {
    (void)close(fd);
  }
  own.clear();
}

bool Share(uint64_t address, uint64_t length, Shared *out, std::string *why) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (address == 0U || length == 0U || address + length < address) {
    *why = "invalid memory range: address " + HexAddr(address) + ", length " + std::to_string(length);
    return false;
  }
  const uint64_t lo = address - address % page;
  const uint64_t hi = (address + length + page - 1U) / page * page;
  std::lock_guard<std::mutex> lock(g_mu);
  const std::vector<Region> regions = Regions();
  ForgetUnmapped(regions);
  size_t i = 0;
  while (i < regions.size() && regions[i].end <= lo) {
    ++i;
  }
  out->offset = address - lo;
  out->length = length;
  uint64_t cursor = lo;
  while (cursor < hi) {
    if (i >= regions.size() || regions[i].start > cursor) {
      *why = "memory " + HexAddr(address) + ".." + HexAddr(address + length) +
             " is not fully mapped in this process: nothing is mapped at " + HexAddr(cursor);
      out->Close();
      return false;
    }
    const Region &r = regions[i];
    uint64_t end = r.end < hi ? r.end : hi;
    if (r.Shareable()) {
      const int fd = FdOf(r, &out->own, why);
      if (fd < 0) {
        out->Close();
        return false;
      }
      Add(out, fd, r.offset + (cursor - r.start), end - cursor);
    } else if (r.Anonymous()) {
      size_t j = i;
      while (end < hi && j + 1U < regions.size() && regions[j + 1U].start == end && regions[j + 1U].Anonymous()) {
        ++j;
        end = regions[j].end < hi ? regions[j].end : hi;
      }
      const int fd = Reback(cursor, end, why);
      if (fd < 0) {
        out->Close();
        return false;
      }
      Add(out, fd, 0U, end - cursor);
      i = j;
    } else {
      *why = "memory at " + HexAddr(cursor) + " (" + (r.path.empty() ? std::string("anonymous") : r.path) + ", " +
             r.perms + ") cannot be handed to the daemon: register private read-write memory (new, malloc, "
             "anonymous mmap), a memfd or a /dev/shm mapping";
      out->Close();
      return false;
    }
    cursor = end;
    ++i;
  }
  if (out->fds.size() > kMaxPieces) {
    *why = "memory " + HexAddr(address) + "+" + std::to_string(length) + " spans " + std::to_string(out->fds.size()) +
           " separately shared pieces; at most 16 per registered address";
    out->Close();
    return false;
  }
  return true;
}

}  // namespace datadist_cpp
