// The prompt side (docs/cpp.md): serves its KV cache, receives the decoder's pushes, then switches to decoder and
// pulls from the decoder that switched to prompt.
//   prompt <listen ip:port> <the decoder's listen ip:port after its switch> [the decoder's cache_id, default 1]
// DATADIST_DAEMON names the local datadistd (unset: the library starts a private one). Start it and the decoder in
// either order: each step waits (bounded) for what the other does, nothing is relayed between them.
#include "common.h"

using namespace example;

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    std::printf("usage: prompt <listen ip:port> <decoder listen ip:port> [decoder cache_id]\n");
    return 2;
  }
  const std::string decoder_addr = argv[2];
  const int64_t decoder_cache = argc == 4 ? std::atoll(argv[3]) : kFirstCacheId;
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
  // batch 3 into our batch 5, and unlinks: its pushes show in our own memory
  WaitFor("PushKvBlocks arrived", [&] { return kv.Holds(6, kDecoderCluster, 4) && kv.Holds(7, kDecoderCluster, 5); });
  WaitFor("PushKvCache arrived", [&] { return kv.Holds(5, kDecoderCluster, 3); });

  // roles switch once the decoder unlinked (SetRole: LLM_EXIST_LINK until then); we pull from the decoder once it
  // listens as a prompt
  Retry("SetRole(kDecoder)", [&] { return dd.SetRole(LlmRole::kDecoder); });
  std::vector<Status> rets;
  Retry("LinkLlmClusters", [&] { return dd.LinkLlmClusters({Remote(kDecoderCluster, decoder_addr)}, rets, 5000); });
  CacheIndex src{};
  src.cluster_id = kDecoderCluster;
  src.cache_id = decoder_cache;
  src.batch_index = 0U;
  CheckStatus(dd.PullKvBlocks(src, kv.AsCache(), {7U}, {0U}), "PullKvBlocks");
  Check(kv.Holds(0, kDecoderCluster, 7), "block 0 holds the decoder's block 7");
  // and hand it back into the decoder's block 0: the decoder sees in its memory that we are done
  CheckStatus(dd.PushKvBlocks(kv.AsCache(), src, {0U}, {0U}), "PushKvBlocks");
  CheckStatus(dd.UnlinkLlmClusters({Remote(kDecoderCluster, decoder_addr)}, rets, 5000), "UnlinkLlmClusters");
  CheckStatus(dd.UnregisterKvCache(kv.cache_id), "UnregisterKvCache");
  dd.Finalize();
  std::printf("[INFO] Prompt end\n");
  return 0;
}
