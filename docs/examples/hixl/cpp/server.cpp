// A HIXL server, server.py in C++: a listening engine whose host buffer a client reads, writes back into, then says
// "done" to.
//   server <listen ip:port> [seconds to wait for the client's notify, default 60]
// Once its buffer is registered it prints one line ending in the client's two arguments, its engine string and the
// buffer's address; then it waits (bounded) for the client's "done" notify, checks the client's WRITE, deregisters
// the buffer and finalizes. DATADIST_DAEMON names the local datadistd (unset: the library starts a private one).
#include <chrono>
#include <cinttypes>
#include <thread>
#include <vector>

#include "common.h"

using namespace example;

int main(int argc, char **argv) {
  if (argc != 2 && argc != 3) {
    std::printf("usage: server <listen ip:port> [timeout seconds, default 60]\n");
    return 2;
  }
  const char *local = argv[1];  // a port: this engine listens; clients connect to exactly this string
  const int timeout_s = argc == 3 ? std::atoi(argv[2]) : 60;

  Hixl engine;
  Check("server", engine.Initialize(local, {}), std::string("Initialize ") + local);
  std::vector<uint8_t> buf(kBufSize);  // host memory; with NPUs, NPU memory registered as MEM_DEVICE
  for (size_t i = 0; i < kBufSize; ++i) buf[i] = Pattern(i);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(buf.data());
  desc.len = buf.size();
  MemHandle handle = nullptr;
  Check("server", engine.RegisterMem(desc, MEM_HOST, handle), "RegisterMem of " + std::to_string(desc.len) + " bytes");
  std::printf("server: ready; run the client with: %s %#" PRIxPTR "\n", local, desc.addr);
  std::fflush(stdout);

  // the client's notify, polled for at most timeout_s
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::vector<NotifyDesc> notifies;
  Status ret = engine.GetNotifies(notifies);
  while (ret == SUCCESS && notifies.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ret = engine.GetNotifies(notifies);
  }
  Check("server", ret, "GetNotifies");
  if (notifies.empty() || std::string(notifies[0].name.GetString()) != "done") {
    std::printf("server: no \"done\" notify within %d s\n", timeout_s);
    return 1;  // ~Hixl finalizes
  }
  std::printf("server: notify '%s': '%s'\n", notifies[0].name.GetString(), notifies[0].notify_msg.GetString());
  size_t wrong = 0;
  for (size_t i = 0; i < kBufSize; ++i) wrong += buf[i] != static_cast<uint8_t>(Pattern(i) ^ 0xFFU);
  std::printf("server: checked the client's WRITE: %zu bytes differ\n", wrong);
  Check("server", engine.DeregisterMem(handle), "DeregisterMem");
  engine.Finalize();
  std::printf("server: finalized\n");
  return wrong == 0 ? 0 : 1;
}
