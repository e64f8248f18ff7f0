// Private: the zero-setup default. Without DATADIST_DAEMON (or the "datadist.daemon" option) the library starts
// a datadistd of its own for this process -- the C++ counterpart of the Python client's embedded daemon
// (client/llm_datadist/_embedded.py), which runs inside the Python process; C++ cannot host it, so it runs as a
// child: `datadistd` from $DATADIST_DAEMON_BIN or PATH, its socket in a fresh 0700 directory, DATADISTD_* variables
// configure it as they configure any daemon; without a peer secret it gets this user's own
// (<$XDG_RUNTIME_DIR or ~/.config>/datadist/peer.secret, as the embedded daemon), never the public development
// secret. It stops when Finalize runs (or with this process: DATADIST_DIE_WITH_PARENT).
#ifndef DATADIST_CPP_PRIVATE_DAEMON_H_
#define DATADIST_CPP_PRIVATE_DAEMON_H_

#include <sys/types.h>

#include <string>

#include "common.h"

namespace datadist_cpp {

class PrivateDaemon {
 public:
  ~PrivateDaemon();
  Status Start(int timeout_ms);
  void Stop();
  std::string target() const { return "unix://" + socket_; }

 private:
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
};

}  // namespace datadist_cpp

#endif  // DATADIST_CPP_PRIVATE_DAEMON_H_
