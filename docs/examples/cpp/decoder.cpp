// The decoder side (docs/cpp.md): links to the prompt, pulls a batch and blocks, pushes blocks and a batch back,
// unlinks, then switches to prompt and serves its cache.
//   decoder <prompt ip:port> <listen ip:port after the switch> [the prompt's cache_id, default 1]
// DATADIST_DAEMON names the local datadistd (unset: the library starts a private one). Start it and the prompt in
// either order: each step waits (bounded) for what the other does, nothing is relayed between them.
#include "common.h"

using namespace example;

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    std::printf("usage: decoder <prompt ip:port> <listen ip:port> [prompt cache_id]\n");
    return 2;
  }
  const std::string prompt_addr = argv[1];
  const int64_t prompt_cache = argc == 4 ? std::atoll(argv[3]) : kFirstCacheId;
  LlmDataDist dd(kDecoderCluster, LlmRole::kDecoder);
  std::map<AscendString, AscendString> options;
  options[OPTION_DEVICE_ID] = "0";
  options[OPTION_SYNC_CACHE_WAIT_TIME] = "5000";
  CheckStatus(dd.Initialize(options), "Initialize");
  KvCache kv;
  kv.Fill(kDecoderCluster);
  CheckStatus(kv.Register(dd), "RegisterKvCache");  // before linking: registered caches are remotely accessible

  std::vector<Status> rets;  // rets[i]: the result of clusters[i]; tried until the prompt listens
  Retry("LinkLlmClusters", [&] { return dd.LinkLlmClusters({Remote(kPromptCluster, prompt_addr)}, rets, 5000); });

  CacheIndex prompt{};
  prompt.cluster_id = kPromptCluster;
  prompt.cache_id = prompt_cache;
  prompt.batch_index = 1U;
  CheckStatus(dd.PullKvCache(prompt, kv.AsCache(), /*batch_index=*/0U), "PullKvCache");  // prompt batch 1 -> our 0
  Check(kv.Holds(0, kPromptCluster, 1), "batch 0 holds the prompt's batch 1");
  prompt.batch_index = 0U;  // a CacheIndex of blocks has batch_index 0
  CheckStatus(dd.PullKvBlocks(prompt, kv.AsCache(), {2U, 3U}, {1U, 2U}), "PullKvBlocks");
  Check(kv.Holds(1, kPromptCluster, 2) && kv.Holds(2, kPromptCluster, 3), "blocks 1, 2 hold the prompt's 2, 3");
  KvCacheExtParam layer1{};  // one layer only: its K and V (tensors 2, 3)
  layer1.src_layer_range = {1, 1};
  layer1.dst_layer_range = {1, 1};
  CheckStatus(dd.PullKvBlocks(prompt, kv.AsCache(), {6U}, {7U}, layer1), "PullKvBlocks(layer 1)");
  Check(kv.tensors[2][7 * kBlockInts] == KvCache::Value(kPromptCluster, 2, 6, 0) &&
            kv.tensors[0][7 * kBlockInts] == KvCache::Value(kDecoderCluster, 0, 7, 0),
        "layer 1 of block 7 pulled, layer 0 untouched");
  kv.Fill(kDecoderCluster);

  CheckStatus(dd.PushKvBlocks(kv.AsCache(), prompt, {4U, 5U}, {6U, 7U}), "PushKvBlocks");
  prompt.batch_index = 5U;
  CheckStatus(dd.PushKvCache(kv.AsCache(), prompt, /*src_batch_index=*/3U), "PushKvCache");
  CheckStatus(dd.UnlinkLlmClusters({Remote(kPromptCluster, prompt_addr)}, rets, 5000), "UnlinkLlmClusters");

  // roles switch: we listen, the prompt pulls from us
  std::map<AscendString, AscendString> listen;
  listen[OPTION_LISTEN_IP_INFO] = argv[2];
  CheckStatus(dd.SetRole(LlmRole::kPrompt, listen), "SetRole(kPrompt)");
  std::printf("[INFO] cache_id = %lld\n", static_cast<long long>(kv.cache_id));
  // the prompt pulls our block 7 and pushes it back into our block 0, then unlinks (SetRole: LLM_EXIST_LINK until
  // then; back to decoder, the listener closes)
  WaitFor("the prompt pulled our block 7 and pushed it back", [&] { return kv.Holds(0, kDecoderCluster, 7); });
  Retry("SetRole(kDecoder)", [&] { return dd.SetRole(LlmRole::kDecoder); });
  CheckStatus(dd.UnregisterKvCache(kv.cache_id), "UnregisterKvCache");
  dd.Finalize();
  std::printf("[INFO] Decoder end\n");
  return 0;
}
