#include "private_daemon.h"

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

extern char **environ;

namespace datadist_cpp {
namespace {
std::string FindDaemon() {
  const char *bin = std::getenv("DATADIST_DAEMON_BIN");
  if (bin != nullptr && *bin != '\0') {
    return bin;
  }
  const char *path = std::getenv("PATH");
  std::string dirs = path == nullptr ? "/usr/local/bin:/usr/bin:/bin" : path;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) {
      colon = dirs.size();
    }
    const std::string dir = dirs.substr(start, colon - start);
    if (!dir.empty()) {
      const std::string candidate = dir + "/datadistd";
      if (access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
    start = colon + 1;
  }
  return "";
}


bool Accepts(const std::string &path, int type) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1U);
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return false;
  }
  const bool ok = connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
  (void)close(fd);
  return ok;
}

// both of the daemon's worker sockets accept connections (it makes them one after the other)
bool Serving(const std::string &socket) {
  return Accepts(socket + ".attach", SOCK_SEQPACKET) && Accepts(socket, SOCK_STREAM);
}
}  // namespace

PrivateDaemon::~PrivateDaemon() { Stop(); }

Status PrivateDaemon::Start(int timeout_ms) {
  const std::string bin = FindDaemon();
  if (bin.empty()) {
    return Fail("Initialize", llm_datadist::LLM_FAILED,
                "no daemon configured (DATADIST_DAEMON) and no datadistd on PATH (or DATADIST_DAEMON_BIN) to start a "
                "private one; install datadist, or point DATADIST_DAEMON at a running daemon's socket");
  }
  const char *tmpdir = std::getenv("TMPDIR");
  std::string templ = std::string(tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : "/tmp") + "/datadist-cpp-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    return Fail("Initialize", llm_datadist::LLM_FAILED, std::string("mkdtemp: ") + std::strerror(errno));
  }
  dir_ = buf.data();
  socket_ = dir_ + "/datadistd.sock";
  std::vector<std::string> env;
  for (char **e = environ; *e != nullptr; ++e) {
    // STATE_DIRECTORY: the worker's own unit's (systemd's StateDirectory=), not a datadist node's; the private
    // daemon uses this user's secret (below), as every embedded daemon of the user does
    if (std::strncmp(*e, "DATADISTD_DAEMON_SOCKET=", 24) != 0 && std::strncmp(*e, "DATADIST_DIE_WITH_PARENT=", 25) != 0 &&
        std::strncmp(*e, "STATE_DIRECTORY=", 16) != 0) {
      env.emplace_back(*e);
    }
  }
  env.push_back("DATADISTD_DAEMON_SOCKET=" + socket_);
  env.push_back("DATADIST_DIE_WITH_PARENT=" + std::to_string(getpid()));
  if (std::getenv("DATADISTD_DAEMON_DRAIN_SECONDS") == nullptr) {
    env.push_back("DATADISTD_DAEMON_DRAIN_SECONDS=1.0");
  }
  // no peer secret set here: a daemon with none configured uses this user's own (datadistd.ops.peersecret), the one
  // embedded Python workers use, and exits at start when that file is unsafe (group/other bits, a symlink) or,
  // as an embedded daemon, when this user has no place for it (never the public development secret)
  if (std::getenv("DATADISTD_PEER_DEV_SECRET_FALLBACK") == nullptr) {
    env.push_back("DATADISTD_PEER_DEV_SECRET_FALLBACK=false");
  }
  std::vector<char *> envp;
  for (std::string &s : env) {
    envp.push_back(&s[0]);
  }
  envp.push_back(nullptr);
  std::string arg0 = bin;
  char *argv[] = {&arg0[0], nullptr};
  const pid_t pid = fork();
  if (pid < 0) {
    Stop();
    return Fail("Initialize", llm_datadist::LLM_FAILED, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    execve(bin.c_str(), argv, envp.data());
    _exit(127);
  }
  pid_ = pid;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!Serving(socket_)) {
    int wstatus = 0;
    if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      Stop();
      return Fail("Initialize", llm_datadist::LLM_FAILED, "the private datadistd (" + bin + ") exited at start; "
                                                          "its log is above");
    }
    if (Clock::now() >= deadline) {
      Stop();
      return Fail("Initialize", llm_datadist::LLM_FAILED, "the private datadistd did not serve in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Log(LogLevel::kInfo, "started a private datadistd (pid " + std::to_string(pid_) + ") at " + socket_);
  return llm_datadist::LLM_SUCCESS;
}

void PrivateDaemon::Stop() {
  if (pid_ > 0) {
    (void)kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(15);
    int wstatus = 0;
    while (waitpid(pid_, &wstatus, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        (void)kill(pid_, SIGKILL);
        (void)waitpid(pid_, &wstatus, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    for (const char *name : {"/datadistd.sock", "/datadistd.sock.attach", "/datadistd.sock.admin"}) {
      (void)unlink((dir_ + name).c_str());
    }
    (void)rmdir(dir_.c_str());
    dir_.clear();
  }
}

}  // namespace datadist_cpp
