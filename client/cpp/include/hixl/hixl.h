/*
 * datadist's C++ client: CANN HIXL's include/hixl/hixl.h -- class hixl::Hixl with CANN's methods, signatures and
 * defaults -- implemented by libcann_hixl.so over datadistd: a Hixl is an engine of the daemon (docs/hixl.md says
 * how each call maps and where datadist differs from CANN).
 */
#ifndef CANN_HIXL_INCLUDE_HIXL_HIXL_H_
#define CANN_HIXL_INCLUDE_HIXL_HIXL_H_

#include <memory>
#include <map>
#include <vector>
#include "hixl_types.h"

namespace hixl {
class ASCEND_FUNC_VISIBILITY Hixl {
 public:
  Hixl();
  ~Hixl();

  // local_engine: "ip", "ip:port", "[ipv6]" or "[ipv6]:port"; a port > 0 makes this engine listen there (the
  // server end). Call before anything else.
  Status Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options);

  void Finalize();

  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle);

  Status DeregisterMem(MemHandle mem_handle);

  // remote_engine: as the remote Hixl's local_engine
  Status Connect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);

  Status Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);

  Status ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);

  Status DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);

  Status GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status);

  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses);

  Status TransferSync(const AscendString &remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis = 1000);

  Status TransferAsync(const AscendString &remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                       TransferReq &req);

  Status GetTransferStatus(const TransferReq &req, TransferStatus &status);

  Status GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results);

  Status SendNotify(const AscendString &remote_engine, const NotifyDesc &notify, int32_t timeout_in_millis = 1000);

  // the notifies this engine received, oldest first; taken
  Status GetNotifies(std::vector<NotifyDesc> &notifies);

  // value: FEATURE_SUPPORTED or FEATURE_NOT_SUPPORTED (unknown features too); PARAM_INVALID for a negative type
  static Status GetCapability(FeatureType feature_type, int32_t &value);

 private:
  class HixlImpl;
  std::unique_ptr<HixlImpl> impl_;
};
}  // namespace hixl

#endif  // CANN_HIXL_INCLUDE_HIXL_HIXL_H_
