// The prompt side (docs/cpp.md): serves its KV cache, receives the decoder's pushes, then switches to decoder and
// pulls from the decoder that switched to prompt.
//   prompt <listen ip:port>
// DATADIST_DAEMON names the local datadistd (unset: the library starts a private one).
#include "common.h"

using namespace example;

int main(int argc, char **argv) {
  if (argc != 2) {
    std::printf("usage: prompt <listen ip:port>\n");
    return 2;
  }
  LlmDataDist dd(kPromptCluster, LlmRole::kPrompt);
  std::map<AscendString, AscendString> options;
  options[OPTION_DEVICE_ID] = "0";
  options[OPTION_LISTEN_IP_INFO] = argv[1];  // a prompt listens: decoders link to it
  options[OPTION_SYNC_CACHE_WAIT_TIME] = "5000";
  CheckStatus(dd.Initialize(options), "Initialize");

  KvCache kv;
  kv.Fill(kPromptCluster);
  CheckStatus(kv.Register(dd), "RegisterKvCache");
  std::printf("[INFO] cache_id = %lld\n", static_cast<long long>(kv.cache_id));

  // the decoder links, pulls our batch 1 and blocks 2, 3, pushes its blocks 4, 5 into our blocks 6, 7 and its
  // batch 3 into our batch 5, and unlinks
  WaitLine("the decoder pulled and pushed");
  Check(kv.Holds(6, kDecoderCluster, 4) && kv.Holds(7, kDecoderCluster, 5), "PushKvBlocks arrived");
  Check(kv.Holds(5, kDecoderCluster, 3), "PushKvCache arrived");

  // roles switch: we pull from the decoder, which now listens as a prompt
  const std::string line = WaitLine("switch <decoder ip:port> <decoder cache_id>");
  const size_t space = line.find(' ', 7);
  const std::string decoder_addr = line.substr(7, space - 7);
  const int64_t decoder_cache = std::atoll(line.c_str() + space + 1);
  CheckStatus(dd.SetRole(LlmRole::kDecoder), "SetRole(kDecoder)");
  std::vector<Status> rets;
  CheckStatus(dd.LinkLlmClusters({Remote(kDecoderCluster, decoder_addr)}, rets, 5000), "LinkLlmClusters");
  CacheIndex src{};
  src.cluster_id = kDecoderCluster;
  src.cache_id = decoder_cache;
  src.batch_index = 0U;
  CheckStatus(dd.PullKvBlocks(src, kv.AsCache(), {7U}, {0U}), "PullKvBlocks");
  Check(kv.Holds(0, kDecoderCluster, 7), "block 0 holds the decoder's block 7");
  CheckStatus(dd.UnlinkLlmClusters({Remote(kDecoderCluster, decoder_addr)}, rets, 5000), "UnlinkLlmClusters");
  CheckStatus(dd.UnregisterKvCache(kv.cache_id), "UnregisterKvCache");
  dd.Finalize();
  std::printf("[INFO] Prompt end\n");
  return 0;
}
