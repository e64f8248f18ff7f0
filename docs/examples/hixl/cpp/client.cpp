// A HIXL client, client.py in C++: connects to the server's engine, READs its buffer in 256 extents, checks every
// byte, WRITEs the bytes back inverted (asynchronously), tells the server "done" with a notify, and disconnects.
//   client <server engine> <server buffer address> [this host's ip towards the server, default 127.0.0.1]
// The first two arguments are the ones the server printed. The local engine names no port: it only connects out.
// DATADIST_DAEMON names the local datadistd (unset: the library starts a private one).
#include <chrono>
#include <thread>
#include <vector>

#include "common.h"

using namespace example;

namespace {
const char *TransferStatusName(TransferStatus status) {
  static const char *const kNames[] = {"WAITING", "COMPLETED", "TIMEOUT", "FAILED"};
  return kNames[static_cast<int>(status)];
}
}  // namespace

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    std::printf("usage: client <server engine> <server buffer address> [local ip, default 127.0.0.1]\n");
    return 2;
  }
  const AscendString server = argv[1];
  const uintptr_t remote = std::strtoull(argv[2], nullptr, 0);
  const char *local = argc == 4 ? argv[3] : "127.0.0.1";

  Hixl engine;
  Check("client", engine.Initialize(local, {}), std::string("Initialize ") + local);
  std::vector<uint8_t> buf(kBufSize);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(buf.data());
  desc.len = buf.size();
  MemHandle handle = nullptr;
  Check("client", engine.RegisterMem(desc, MEM_HOST, handle), "RegisterMem of " + std::to_string(desc.len) + " bytes");
  Check("client", engine.Connect(server, 5000), std::string("Connect ") + argv[1]);

  // block i of the server's buffer <-> block kBlocks-1-i of ours: any pairing of extents is one transfer
  std::vector<TransferOpDesc> descs;
  for (size_t i = 0; i < kBlocks; ++i) descs.push_back({desc.addr + (kBlocks - 1 - i) * kBlock, remote + i * kBlock, kBlock});
  const auto t0 = std::chrono::steady_clock::now();
  Check("client", engine.TransferSync(server, READ, descs, 10000),
        "TransferSync READ of " + std::to_string(descs.size()) + " extents");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t wrong = 0;
  for (size_t i = 0; i < kBufSize; ++i) wrong += buf[(kBlocks - 1 - i / kBlock) * kBlock + i % kBlock] != Pattern(i);
  std::printf("client: read %zu bytes in %.1f ms; %zu bytes differ\n", buf.size(), ms, wrong);
  if (wrong != 0) return 1;  // ~Hixl disconnects and finalizes

  for (auto &b : buf) b ^= 0xFFU;  // our answer: every byte inverted, written back to where it came from
  TransferReq req = nullptr;
  Check("client", engine.TransferAsync(server, WRITE, descs, TransferArgs{}, req),
        "TransferAsync WRITE of " + std::to_string(descs.size()) + " extents");
  // polled until it finishes (a finished request is reported once)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  TransferStatus status = TransferStatus::WAITING;
  Status ret = engine.GetTransferStatus(req, status);
  while (ret == SUCCESS && status == TransferStatus::WAITING && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ret = engine.GetTransferStatus(req, status);
  }
  Check("client", ret, "GetTransferStatus");
  std::printf("client: the WRITE is %s\n", TransferStatusName(status));
  if (status != TransferStatus::COMPLETED) return 1;

  NotifyDesc notify;  // the server waits for this
  notify.name = "done";
  notify.notify_msg = AscendString(("wrote " + std::to_string(buf.size()) + " bytes").c_str());
  Check("client", engine.SendNotify(server, notify, 5000), "SendNotify done");
  Check("client", engine.Disconnect(server, 5000), "Disconnect");
  Check("client", engine.DeregisterMem(handle), "DeregisterMem");  // after Disconnect, as HIXL requires
  engine.Finalize();
  std::printf("client: finalized\n");
  return 0;
}
