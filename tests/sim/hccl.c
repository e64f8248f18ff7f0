/* A SIMULATED libhccl.so for tests: no NPU, no network card, no CANN. Written by datadist, not Huawei's.
 *
 * One-sided HCCL as LLM-DataDist uses it, with the prototypes of CANN's headers (hccl_types.h,
 * LLM-DataDist's comm_types.h): HcclCommInitClusterInfoMemConfig, HcclRegisterGlobalMem /
 * HcclDeregisterGlobalMem, HcclCommBindMem / HcclCommUnbindMem, HcclCommPrepare, HcclBatchPut /
 * HcclBatchGet, HcclCommDestroy. The ranks of a communicator are processes on this host; a rank's
 * bound memory is published in a file of $ASCEND_SIM_DIR, and a put or get really moves the bytes
 * between the two processes' simulated device memory (ascendcl.c), on the stream's thread.
 *
 * Checked as HCCL checks, with HCCL's codes: the config's size and magic word, the rank against the
 * rank table, registrations inside memory the runtime allocated (device: aclrtMalloc or an IPC import; host:
 * aclrtMallocHost), Prepare before any transfer (both ranks meet there, within its timeout), a peer that is gone.
 * And CANN's rules of the one-sided service (docs/ascend.md "verified where"; each check names its source, a fact
 * carried over, not code: hcomm = hicann/hcomm, hixl = hicann/hixl):
 *
 *   R1  HcclCommPrepare's timeout is in SECONDS; -1 waits for ever, 0 the default connect timeout
 *       (HCCL_CONNECT_TIMEOUT, 120 s), below -1 HCCL_E_PARA (hcomm hccl_one_sided_services.h, "单位秒").
 *   R2  at most ASCEND_SIM_MAX_DESC descriptors per HcclBatchPut/Get (default 256; 64 models the V2 path),
 *       more: HCCL_E_PARA (hcomm one_sided_service_adapt.cc HcclBatchParaCheck, MAX_DESC_NUM).
 *   R3  HcclCommBindMem only records the handle; what the peer can reach is the set bound at the first successful
 *       Prepare (memory descriptors are exchanged there); a later bind is recorded, never visible (hcomm's
 *       one-sided service as the finding cites it; hixl comm_entity.cc binds every handle before Prepare).
 *   R4  every descriptor lies inside ONE buffer enabled at Prepare, on both sides; else HCCL_E_INTERNAL
 *       (hcomm transport_roce_mem.cc / transport_ipc_mem.cc FillRmaBufferSlice: "Can't find remoteBuffer by key").
 *   R5  a Prepare after a successful one returns at once (nothing new is exchanged; hcomm's one-sided service as
 *       the finding cites it).
 *   R6  the global-memory registry is per device, chosen by the CALLING THREAD's current device
 *       (hcomm global_mem_manager.cc GlobalMemRegMgr::GetInstance, hrtGetDeviceRefresh): deregistering (or
 *       unbinding) a handle from a thread on another device does not find it (HCCL_E_PARA, R23); the same range
 *       twice gives the same handle, an overlapping one HCCL_E_PARA (CheckOverlapAndInsert); deregistering a
 *       bound handle HCCL_E_PARA (DeReg: "still bound to comm(s)").
 *   R7  deregistering the LAST registration of a device tears its NIC down (DeReg -> Destroy -> DeInitNic):
 *       a communicator prepared before that fails every later transfer (HCCL_E_NETWORK here).
 *   R8  HcclCommDestroy refuses while memory is still bound to the communicator (HCCL_E_PARA): unbind first
 *       (hcomm's one-sided service as the finding cites it; hixl unbinds each before destroying).
 *   R9  communicator names are unique per device (hcomm InitOneSidedHcomInfo: a name already in the device's
 *       one-sided map is "comm Name exist", HCCL_E_PARA).
 *   R10 GUARD: HcclCommInitClusterInfoMemConfig must not run concurrently in a process (hixl comm_entity.cc: "the
 *       underlying hccl library does not support parallel HcclCommInitClusterInfoMemConfig calls"): a second
 *       call while one runs fails loudly (stderr, HCCL_E_INTERNAL). Each call takes ASCEND_SIM_INIT_MS (20).
 *   R11 a batch call that fails on descriptor i has ENQUEUED descriptors 0..i-1 on the stream (they run unless
 *       the stream is aborted: hixl aborts on any failure, LLM_DISMISSABLE_GUARD -> aclrtStreamAbort; the enqueue
 *       order as the finding cites hcomm).
 *   R14 GUARD: bind, unbind and destroy must not run while HcclCommPrepare runs on the communicator (Prepare iterates the
 *       bound set; hixl takes the entity's mutex for Finalize, which Initialize holds through Prepare): the
 *       simulation says so loudly (stderr, HCCL_E_INTERNAL).
 *   R15 a Prepare meets the peer rank's communicator OF THE SAME NAME that is in its own Prepare and has met nobody
 *       there yet -- whichever instance that is: HCCL tells the two ends of a Prepare's connection apart by its
 *       socket tag alone, "<server ip>_<port>_<client ip>_<port>_<comm name>" (hcomm hccl_one_sided_conn.cc
 *       HcclOneSidedConn::Connect), so a new communicator cannot be told from an older one of its name that is still
 *       waiting. A meeting is one connection, made for both ends at once: each end then has met exactly that
 *       instance (its Prepare ends, even if the other is destroyed right after), and neither meets another.
 *   R16 a transfer travels the connection its Prepare made: once the peer instance met there is destroyed, every
 *       put and get fails (HCCL_E_NETWORK here), even when a new communicator of the same name stands in its place
 *       (hcomm hccl_one_sided_conn.cc: the data socket and QP made in Connect are the connection's for its life;
 *       hccl_socket_manager.cc DestroySockets closes a communicator's sockets when it goes).
 *   R17 the rank table's version is "1.0" or "1.2" (hixl rank_table_generator.cc: "only support 1.0 and 1.2"; hcomm
 *       topoinfo_ranktableParser.cc as the finding cites it), else HCCL_E_PARA at init.
 *   R18 no two devices of a rank table share a device_ip (hcomm topoinfo_ranktableParser.cc "[IP] is repeate", as the
 *       finding cites it): HCCL_E_PARA at HcclCommInitClusterInfoMemConfig.
 *   R19 a 1.2 table names each device's super_device_id (hixl rank_table_generator_v2.cc from_json: at
 *       "super_device_id") and a super_pod_list: else HCCL_E_PARA at init.
 *   R20 HCCL opens this rank's NPU NIC by the table's device_ip (hcomm global_mem_manager.cc HcclNetOpenDev, as the
 *       finding cites it): an address that is not the NIC address of the communicator's PHYSICAL NPU on this node
 *       (ASCEND_SIM_HCCN_CONF, /etc/hccn.conf's address_<physical id>) is not found -- the Prepare waits its whole
 *       timeout, as hccp does, and fails HCCL_E_TIMEOUT. On an A3 a 1.2 table's super_device_id must be the NPU's
 *       (aclrtGetDeviceInfo SUPER_POD_DEVICE_ID): vNIC addresses are looked up by it (HCCL_E_INTERNAL at Prepare).
 *   R21 a 1.0 table on an A3 SoC fails Prepare (HCCL_E_INTERNAL): hcomm treats every pair as one super pod and
 *       looks vNIC addresses up by an invalid super device id (hccl_one_sided_service.cc IsUsedRdma, as the finding
 *       cites it); LLM-DataDist writes 1.2 on Ascend910_93xx (hixl rank_table_generator.cc kV2Version, read).
 *   R22 a range bound to a communicator is at most 64 GiB: a larger one fails Prepare (HCCL_E_PARA), not its
 *       registration (hcomm's one-sided service, as the finding cites it).
 *   R23 a handle unknown in the calling thread's device's registry, or a thread with no device, is HCCL_E_PARA (1)
 *       (hcomm HcclMemHandleParamCheck, as the finding cites it) -- never HCCL_E_NOT_FOUND.
 *   R24 one listener per (NIC address, device port) on a node: a second PROCESS whose communicator listens on the
 *       same NPU NIC address and port (the table's device_port, HCCL's 16666 when it names none) fails its Prepare
 *       (HCCL_E_NETWORK). Not settled from the source (what hccp does with a second listener): the first-hour check
 *       `second_hccl_process` decides; a model, so that a daemon never shares a worker's port.
 *   R27 the transport to each peer rank is chosen at Prepare as hcomm chooses it (hccl_one_sided_service.cc
 *       IsUsedRdma, read): on an A2 (Ascend910B*) RoCE when HCCL_INTRA_ROCE_ENABLE is non-zero or the two ranks'
 *       server_id differ, else HCCS; on an A3 (Ascend910_93*) RoCE when the switch is set or their super_pod_id
 *       differ (a 1.0 table names none: one super pod), else HCCS; any other SoC RoCE. Only when some peer is RoCE
 *       does Prepare open the NPU NIC by the table's device_ip and listen on it (one_sided_service_adapt.cc
 *       HcclCommPrepare: InitIsUsedRdmaMap -> needInitNic -> GetNetDevCtx(DEVICE_NIC_TYPE, device ip) ->
 *       OneSidedServiceStartListen, read): R20's address check and R24 apply to RoCE only; an HCCS peer is reached
 *       over the vNIC by physical id (A2) or super device id (A3: R20's super device id check, SetupRemoteRankInfo,
 *       read). Recorded per communicator (pub_head hccs/roce: how many peers its Prepare chose each for). Not
 *       modelled: IsUsedRdma's HCCL_E_NOT_SUPPORT for two NPUs of one A2 server not linked by HCCS (the simulated
 *       server's eight are).
 * Guards stricter than CANN (they say so when they fire; CANN has no check): R10 (hcomm has no check; the rule is
 * LLM-DataDist's own mutex) and R14 (undefined in hcomm).
 *
 * A put or get whose peer dies while it runs stalls -- no byte lands after the peer is gone -- until its
 * stream is aborted or destroyed (RoCE retransmits to a dead peer for HCCL_RDMA_TIMEOUT x
 * HCCL_RDMA_RETRY_CNT, longer than any transfer deadline): the initiator sees its synchronisation time out.
 * Knobs: ASCEND_SIM_WIRE_MBPS (megabits per second, default 0 = no limit) paces the bytes of every put and
 * get like a wire of that rate, so a test can fault a transfer while it is on the wire; ASCEND_SIM_MAX_DESC;
 * ASCEND_SIM_INIT_MS; HCCL_CONNECT_TIMEOUT; ASCEND_SIM_FAIL_INITS=n: the process's first n communicator
 * creations fail (HCCL_E_INTERNAL), a fault of one end of a link for a test to inject.
 *
 * Not simulated: the wire (RoCE/HCCS) beyond that pace, traffic class and service level (accepted,
 * recorded only).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

typedef int HcclResult;
typedef void *HcclComm;
typedef void *aclrtStream;

#define HCCL_SUCCESS 0
#define HCCL_E_PARA 1
#define HCCL_E_PTR 2
#define HCCL_E_MEMORY 3
#define HCCL_E_INTERNAL 4
#define HCCL_E_NOT_FOUND 6
#define HCCL_E_TIMEOUT 9
#define HCCL_E_NETWORK 19

#define CONFIG_MAGIC 0xf0f0f0f0u

typedef struct {
  char reserved[24]; /* size_t configSize; uint32_t magic; uint32_t version; uint64_t reserved */
  uint32_t hcclBufferSize;
  uint32_t hcclDeterministic;
  char hcclCommName[128];
  char hcclUdi[128];
  uint32_t hcclOpExpansionMode;
  uint32_t hcclRdmaTrafficClass;
  uint32_t hcclRdmaServiceLevel;
  uint32_t hcclWorldRankID;
  uint64_t hcclJobID;
} HcclCommConfig;

typedef enum { COMM_MEM_TYPE_INVALID = -1, COMM_MEM_TYPE_DEVICE = 0, COMM_MEM_TYPE_HOST = 1 } CommMemType;
typedef struct {
  CommMemType type;
  void *addr;
  uint64_t size;
} CommMem;

typedef struct {
  void *localAddr;
  void *remoteAddr;
  uint64_t count;
  int dataType;
} HcclOneSideOpDesc;

typedef struct {
  int topoType;
  uint64_t rsvd0, rsvd1, rsvd2;
} HcclPrepareConfig;

typedef struct mem_handle {
  sim_region region;
  int binds;
  int registry; /* the device whose registry holds it (R6): the registering thread's, SIM_NO_DEVICE without one */
  struct mem_handle *next;
} mem_handle;

#define MAX_BOUND 1024
#define MAX_TABLE_DEVS 64
#define MAX_MAPS 256
#define SIM_NO_DEVICE 64 /* GetInstance's reserve instance: a thread without a device */

typedef struct { /* one published record of a rank's bound memory */
  uint64_t addr, size, file_offset;
  char file[200];
} pub_entry;

typedef struct { /* tests read it too (tests/integration/test_npus.py, test_hccl_cann.py): keep the layout in step */
  int32_t pid;
  int32_t prepared; /* in its Prepare, or past it */
  uint32_t count;
  uint32_t traffic_class, service_level;
  int32_t device;
  uint64_t id; /* this instance of the communicator (R15, R16): unique, never reused */
  uint32_t hccs, roce; /* R27: peer ranks its Prepare chose HCCS / RoCE for (0, 0 before Prepare) */
} pub_head;

typedef struct {
  char file[200];
  uint64_t offset, size;
  void *base;
} mapping;

typedef struct comm_s {
  char name[128];
  uint64_t id;           /* this instance (R15, R16) */
  uint64_t *met;         /* by rank: the peer instance its Prepare met, 0 before (R15, R16) */
  uint32_t rank, nranks;
  int prepared;          /* a Prepare succeeded: the enabled set is fixed (R3, R5) */
  int preparing;         /* a Prepare runs (R14) */
  uint64_t nic_epoch;    /* the device's NIC generation at Prepare (R7) */
  uint32_t traffic_class, service_level;
  int device; /* the thread's PHYSICAL device when the communicator was made: its memory must be there */
  char own_ip[64];       /* this rank's device_ip in the table: the NIC it opens (R20) */
  char own_sdid[24];     /* this rank's super_device_id (1.2), "" otherwise (R20) */
  int own_port;          /* this rank's device_port, 16666 by default (R24) */
  int v12;               /* the table is version 1.2 (R21) */
  char servers[MAX_TABLE_DEVS][64], pods[MAX_TABLE_DEVS][64]; /* by rank: its server_id, super_pod_id (R27) */
  uint32_t hccs, roce;   /* peer ranks its Prepare chose each transport for (R27) */
  mem_handle *bound[MAX_BOUND];  /* recorded by HcclCommBindMem */
  int nbound;
  sim_region enabled[MAX_BOUND]; /* what was bound at Prepare: all a transfer may touch (R3, R4) */
  int nenabled;
  mapping maps[MAX_MAPS];
  int nmaps;
  pthread_mutex_t lock;
  struct comm_s *next;
} comm_t;

/* process-wide state of the library: the registries (R6, R7), the live communicators (R9), the init guard (R10) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mem_handle *g_registry[SIM_NO_DEVICE + 1];
static uint64_t g_nic_epoch[SIM_NO_DEVICE + 1];
static comm_t *g_comms;
static int g_initing;
static long g_inits; /* communicators this process tried to make (ASCEND_SIM_FAIL_INITS) */

/* R14: a call that changes what Prepare iterates, made while it runs */
static int during_prepare(comm_t *c, const char *call) {
  if (!__atomic_load_n(&c->preparing, __ATOMIC_SEQ_CST)) return 0;
  fprintf(stderr, "SIMULATED HCCL: %s while HcclCommPrepare runs on communicator %s (wait for it first)\n", call,
          c->name);
  return 1;
}

static int registry_of_thread(void) {
  int d = simacl_current_device();
  return d >= 0 && d < SIM_NO_DEVICE ? d : SIM_NO_DEVICE;
}

static long env_long(const char *name, long fallback) {
  const char *s = getenv(name);
  return s && *s ? atol(s) : fallback;
}

static const char *sim_dir(void) {
  const char *d = getenv("ASCEND_SIM_DIR");
  return d && *d ? d : NULL;
}

static void pub_path(const comm_t *c, uint32_t rank, char *out, size_t n) {
  snprintf(out, n, "%s/comm-%s-r%u", sim_dir(), c->name, rank);
}

/* write what this rank's peers may reach -- the set enabled at Prepare -- where they read it (atomically) */
static HcclResult publish_locked(comm_t *c) {
  char path[400], tmp[420];
  pub_path(c, c->rank, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return HCCL_E_INTERNAL;
  pub_head h = {(int32_t)getpid(), c->prepared, (uint32_t)c->nenabled, c->traffic_class, c->service_level,
                c->device, c->id, c->hccs, c->roce};
  int ok = write(fd, &h, sizeof h) == (ssize_t)sizeof h;
  for (int i = 0; ok && i < c->nenabled; i++) {
    pub_entry e = {0};
    sim_region *r = &c->enabled[i];
    e.addr = r->addr;
    e.size = r->size;
    e.file_offset = r->file_offset;
    snprintf(e.file, sizeof e.file, "%s", r->file);
    ok = write(fd, &e, sizeof e) == (ssize_t)sizeof e;
  }
  close(fd);
  if (!ok || rename(tmp, path)) {
    unlink(tmp);
    return HCCL_E_INTERNAL;
  }
  return HCCL_SUCCESS;
}

/* count the "rank_id" fields of the rank table: the communicator's size */
static uint32_t count_ranks(const char *table) {
  uint32_t n = 0;
  for (const char *p = table; (p = strstr(p, "\"rank_id\"")) != NULL; p += 9) n++;
  return n;
}

/* the string value of "key" in [p, end): 0 and its text in out, -1 if absent */
static int field(const char *p, const char *end, const char *key, char *out, size_t n) {
  char pat[48];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  for (const char *q = p; (q = strstr(q, pat)) != NULL && q < end; q += strlen(pat)) {
    const char *v = q + strlen(pat);
    while (*v == ' ' || *v == ':') v++;
    if (*v != '"') continue;
    const char *close = strchr(++v, '"');
    if (!close || close > end || (size_t)(close - v) >= n) return -1;
    memcpy(out, v, (size_t)(close - v));
    out[close - v] = 0;
    return 0;
  }
  return -1;
}

typedef struct {
  char ip[64], id[16], sdid[24], port[16], server[64], pod[64];
  uint32_t rank;
} table_dev;

/* the '{' of the object enclosing p (the tables hold no braces inside strings), or NULL */
static const char *enclosing(const char *t, const char *p) {
  int depth = 0;
  for (const char *q = p - 1; q >= t; q--) {
    if (*q == '}') depth++;
    else if (*q == '{' && depth-- == 0) return q;
  }
  return NULL;
}

/* the bracket closing the '{' or '[' at open, or NULL */
static const char *closing(const char *open) {
  int depth = 0;
  for (const char *q = open; *q; q++) {
    if (*q == '{' || *q == '[') depth++;
    else if ((*q == '}' || *q == ']') && --depth == 0) return q;
  }
  return NULL;
}

/* R27: d's server_id (the server object holding it) and super_pod_id (the super_pod_list entry naming that server;
   "" when the table has none) */
static void place(const char *t, const char *open, table_dev *d) {
  const char *server = enclosing(t, open), *end = server ? closing(server) : NULL;
  if (end) field(server, end, "server_id", d->server, sizeof d->server);
  const char *list = strstr(t, "\"super_pod_list\""), *arr = list ? strchr(list, '[') : NULL;
  const char *arr_end = arr ? closing(arr) : NULL;
  for (const char *q = arr; arr_end && (q = strstr(q, "\"server_id\"")) != NULL && q < arr_end; q += 11) {
    char id[64];
    const char *entry = enclosing(t, q), *pod = entry ? enclosing(t, entry) : NULL;
    const char *entry_end = entry ? closing(entry) : NULL, *pod_end = pod ? closing(pod) : NULL;
    if (!pod_end || !entry_end || field(entry, entry_end, "server_id", id, sizeof id) || strcmp(id, d->server))
      continue;
    field(pod, pod_end, "super_pod_id", d->pod, sizeof d->pod);
    return;
  }
}

/* the rank table's version and devices (the flat objects holding "rank_id"); HCCL_E_PARA when it is not one */
static HcclResult parse_table(const char *t, char *version, size_t vn, table_dev *devs, uint32_t *ndevs) {
  if (field(t, t + strlen(t), "version", version, vn)) return HCCL_E_PARA;
  *ndevs = 0;
  for (const char *p = t; (p = strstr(p, "\"rank_id\"")) != NULL; p += 9) {
    const char *open = p, *close = strchr(p, '}');
    while (open > t && *open != '{') open--;
    if (*open != '{' || !close || *ndevs == MAX_TABLE_DEVS) return HCCL_E_PARA;
    table_dev *d = &devs[(*ndevs)++];
    char rank[16];
    memset(d, 0, sizeof *d);
    if (field(open, close, "rank_id", rank, sizeof rank) || field(open, close, "device_id", d->id, sizeof d->id))
      return HCCL_E_PARA;
    d->rank = (uint32_t)atol(rank);
    field(open, close, "device_ip", d->ip, sizeof d->ip);
    field(open, close, "super_device_id", d->sdid, sizeof d->sdid);
    field(open, close, "device_port", d->port, sizeof d->port);
    place(t, open, d);
  }
  return HCCL_SUCCESS;
}

/* the rank table's rules at init (R17, R18, R19); this rank's device in *own */
static HcclResult check_table(const char *t, uint32_t rank, comm_t *c) {
  char version[16];
  table_dev devs[MAX_TABLE_DEVS];
  uint32_t n = 0;
  if (parse_table(t, version, sizeof version, devs, &n) != HCCL_SUCCESS) return HCCL_E_PARA;
  int v10 = strcmp(version, "1.0") == 0, v12 = strcmp(version, "1.2") == 0;
  if (!v10 && !v12) return HCCL_E_PARA; /* R17 */
  if (v12 && !strstr(t, "\"super_pod_list\"")) return HCCL_E_PARA; /* R19 */
  for (uint32_t i = 0; i < n; i++) {
    if (v12 && !devs[i].sdid[0]) return HCCL_E_PARA; /* R19: "super_device_id" is required */
    for (uint32_t j = 0; j < i; j++)
      if (devs[i].ip[0] && strcmp(devs[i].ip, devs[j].ip) == 0) {
        fprintf(stderr, "SIMULATED HCCL: rank table: device ip %s is repeated (ranks %u and %u)\n", devs[i].ip,
                devs[j].rank, devs[i].rank);
        return HCCL_E_PARA; /* R18: "[IP] is repeate" */
      }
    if (devs[i].rank < MAX_TABLE_DEVS) {
      memcpy(c->servers[devs[i].rank], devs[i].server, sizeof devs[i].server);
      memcpy(c->pods[devs[i].rank], devs[i].pod, sizeof devs[i].pod);
    }
    if (devs[i].rank == rank) {
      memcpy(c->own_ip, devs[i].ip, sizeof c->own_ip);
      memcpy(c->own_sdid, devs[i].sdid, sizeof c->own_sdid);
      c->own_port = devs[i].port[0] ? atoi(devs[i].port) : 16666;
    }
  }
  c->v12 = v12;
  return HCCL_SUCCESS;
}

static HcclResult init_comm(const char *clusterInfo, uint32_t rank, HcclCommConfig *config, HcclComm *comm) {
  uint64_t size;
  uint32_t magic;
  memcpy(&size, config->reserved, sizeof size);
  memcpy(&magic, config->reserved + 8, sizeof magic);
  if (size != sizeof(HcclCommConfig) || magic != CONFIG_MAGIC) return HCCL_E_PARA;
  if (!sim_dir() || !strstr(clusterInfo, "\"server_list\"")) return HCCL_E_PARA;
  uint32_t nranks = count_ranks(clusterInfo);
  if (nranks < 2 || rank >= nranks) return HCCL_E_PARA;
  if (simacl_current_device() < 0) return HCCL_E_PARA; /* no aclrtSetDevice on this thread */
  if (__atomic_add_fetch(&g_inits, 1, __ATOMIC_SEQ_CST) <= env_long("ASCEND_SIM_FAIL_INITS", 0))
    return HCCL_E_INTERNAL; /* the fault a test injected */
  size_t name_len = strnlen(config->hcclCommName, sizeof config->hcclCommName);
  if (name_len == 0 || name_len == sizeof config->hcclCommName || strchr(config->hcclCommName, '/'))
    return HCCL_E_PARA;
  usleep((useconds_t)env_long("ASCEND_SIM_INIT_MS", 20) * 1000u); /* the time a real init takes: R10's window */
  comm_t *c = calloc(1, sizeof *c);
  if (c) c->met = calloc(nranks, sizeof *c->met);
  if (!c || !c->met || getrandom(&c->id, sizeof c->id, 0) != (ssize_t)sizeof c->id || !c->id) {
    if (c) free(c->met);
    free(c);
    return HCCL_E_MEMORY;
  }
  memcpy(c->name, config->hcclCommName, name_len);
  HcclResult table = check_table(clusterInfo, rank, c);
  if (table != HCCL_SUCCESS) {
    free(c->met);
    free(c);
    return table;
  }
  c->rank = rank;
  c->nranks = nranks;
  c->traffic_class = config->hcclRdmaTrafficClass;
  c->service_level = config->hcclRdmaServiceLevel;
  c->device = simacl_current_device();
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_lock(&g_lock);
  for (comm_t *o = g_comms; o; o = o->next) {
    if (o->device == c->device && strcmp(o->name, c->name) == 0) { /* R9: "comm Name exist" */
      pthread_mutex_unlock(&g_lock);
      pthread_mutex_destroy(&c->lock);
      free(c->met);
      free(c);
      return HCCL_E_PARA;
    }
  }
  c->next = g_comms;
  g_comms = c;
  pthread_mutex_unlock(&g_lock);
  if (publish_locked(c) != HCCL_SUCCESS) {
    pthread_mutex_lock(&g_lock);
    for (comm_t **pp = &g_comms; *pp; pp = &(*pp)->next)
      if (*pp == c) { *pp = c->next; break; }
    pthread_mutex_unlock(&g_lock);
    free(c->met);
    free(c);
    return HCCL_E_INTERNAL;
  }
  *comm = c;
  return HCCL_SUCCESS;
}

HcclResult HcclCommInitClusterInfoMemConfig(const char *clusterInfo, uint32_t rank, HcclCommConfig *config,
                                            HcclComm *comm) {
  if (!clusterInfo || !config || !comm) return HCCL_E_PTR;
  /* R10: hixl comm_entity.cc holds a process-wide mutex around this call ("the underlying hccl library does not
     support parallel HcclCommInitClusterInfoMemConfig calls"); the simulation says so when it happens */
  if (__atomic_fetch_add(&g_initing, 1, __ATOMIC_SEQ_CST) != 0) {
    __atomic_sub_fetch(&g_initing, 1, __ATOMIC_SEQ_CST);
    fprintf(stderr, "SIMULATED HCCL: concurrent HcclCommInitClusterInfoMemConfig calls in process %d (CANN does not "
                    "support them: hold one process-wide lock)\n", (int)getpid());
    return HCCL_E_INTERNAL;
  }
  HcclResult ret = init_comm(clusterInfo, rank, config, comm);
  __atomic_sub_fetch(&g_initing, 1, __ATOMIC_SEQ_CST);
  return ret;
}

HcclResult HcclRegisterGlobalMem(CommMem *mem, void **memHandle) {
  if (!mem || !memHandle || !mem->addr) return HCCL_E_PTR;
  if (mem->size == 0) return HCCL_E_PARA;
  sim_region r;
  int want = mem->type == COMM_MEM_TYPE_DEVICE ? SIM_DEVICE : mem->type == COMM_MEM_TYPE_HOST ? SIM_HOST : 0;
  /* device memory from aclrtMalloc or an IPC import; host memory only from aclrtMallocHost */
  if (!want || !simacl_resolve(mem->addr, mem->size, &r) || r.kind != want) return HCCL_E_PARA;
  int reg = registry_of_thread(); /* R6: the registry of the calling thread's device */
  uintptr_t a = (uintptr_t)mem->addr;
  pthread_mutex_lock(&g_lock);
  for (mem_handle *o = g_registry[reg]; o; o = o->next) {
    if (o->region.addr == a && o->region.size == mem->size) { /* the same range: the same record */
      *memHandle = o;
      pthread_mutex_unlock(&g_lock);
      return HCCL_SUCCESS;
    }
    if (a < o->region.addr + o->region.size && o->region.addr < a + mem->size) { /* overlaps another record */
      pthread_mutex_unlock(&g_lock);
      return HCCL_E_PARA;
    }
  }
  mem_handle *h = calloc(1, sizeof *h);
  if (!h) {
    pthread_mutex_unlock(&g_lock);
    return HCCL_E_MEMORY;
  }
  h->region = r;
  h->region.file_offset = r.file_offset + (a - r.addr);
  h->region.backing = (char *)r.backing + (a - r.addr);
  h->region.addr = a;
  h->region.size = mem->size;
  h->registry = reg;
  h->next = g_registry[reg];
  g_registry[reg] = h;
  pthread_mutex_unlock(&g_lock);
  *memHandle = h;
  return HCCL_SUCCESS;
}

/* `h` in the registry of the calling thread's device (R6), under g_lock: its link, or NULL */
static mem_handle **find_registered_locked(const mem_handle *h) {
  for (mem_handle **pp = &g_registry[registry_of_thread()]; *pp; pp = &(*pp)->next)
    if (*pp == h) return pp;
  return NULL;
}

HcclResult HcclDeregisterGlobalMem(void *memHandle) {
  mem_handle *h = memHandle;
  if (!h) return HCCL_E_PTR;
  pthread_mutex_lock(&g_lock);
  mem_handle **pp = find_registered_locked(h);
  HcclResult ret = HCCL_SUCCESS;
  if (!pp) ret = HCCL_E_PARA; /* R6, R23: not in this thread's device's registry (HcclMemHandleParamCheck) */
  else if (__atomic_load_n(&h->binds, __ATOMIC_SEQ_CST)) ret = HCCL_E_PARA; /* R6: still bound to a communicator */
  if (ret == HCCL_SUCCESS) {
    *pp = h->next;
    if (!g_registry[h->registry]) g_nic_epoch[h->registry]++; /* R7: the last one tears the device's NIC down */
    free(h);
  }
  pthread_mutex_unlock(&g_lock);
  return ret;
}

HcclResult HcclCommBindMem(HcclComm comm, void *memHandle) {
  comm_t *c = comm;
  mem_handle *h = memHandle;
  if (!c || !h) return HCCL_E_PTR;
  if (during_prepare(c, "HcclCommBindMem")) return HCCL_E_INTERNAL;
  pthread_mutex_lock(&c->lock);
  HcclResult ret = HCCL_SUCCESS;
  for (int i = 0; i < c->nbound; i++)
    if (c->bound[i] == h) ret = HCCL_E_PARA; /* bound twice */
  if (h->region.kind == SIM_DEVICE && h->region.device != c->device) ret = HCCL_E_PARA; /* another NPU's memory */
  if (ret == HCCL_SUCCESS && c->nbound == MAX_BOUND) ret = HCCL_E_MEMORY;
  if (ret == HCCL_SUCCESS) { /* R3: recorded only; the peer sees what was bound at Prepare */
    c->bound[c->nbound++] = h;
    __atomic_add_fetch(&h->binds, 1, __ATOMIC_SEQ_CST);
  }
  pthread_mutex_unlock(&c->lock);
  return ret;
}

HcclResult HcclCommUnbindMem(HcclComm comm, void *memHandle) {
  comm_t *c = comm;
  mem_handle *h = memHandle;
  if (!c || !h) return HCCL_E_PTR;
  pthread_mutex_lock(&g_lock);
  int known = find_registered_locked(h) != NULL;
  pthread_mutex_unlock(&g_lock);
  if (!known) return HCCL_E_PARA; /* R6, R23: looked up in the calling thread's device's registry */
  if (during_prepare(c, "HcclCommUnbindMem")) return HCCL_E_INTERNAL;
  pthread_mutex_lock(&c->lock);
  HcclResult ret = HCCL_E_NOT_FOUND;
  for (int i = 0; i < c->nbound; i++) {
    if (c->bound[i] == h) {
      c->bound[i] = c->bound[--c->nbound];
      __atomic_sub_fetch(&h->binds, 1, __ATOMIC_SEQ_CST);
      ret = HCCL_SUCCESS;
      break;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return ret;
}

/* the published state of `rank`: 0 and its entries (malloc'd) in *out, or -1 when absent */
static int read_peer(comm_t *c, uint32_t rank, pub_head *head, pub_entry **out) {
  char path[400];
  pub_path(c, rank, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = -1;
  if (read(fd, head, sizeof *head) == (ssize_t)sizeof *head && head->count <= MAX_BOUND) {
    size_t bytes = sizeof(pub_entry) * head->count;
    *out = malloc(bytes ? bytes : 1);
    if (*out && read(fd, *out, bytes) == (ssize_t)bytes) rc = 0;
    else free(*out);
  }
  close(fd);
  return rc;
}

/* R15: who met whom, one file per end in $ASCEND_SIM_DIR: met-<instance>-r<peer rank> holds the peer instance that
   instance met (and its process). Both ends' are written at once, under the directory's lock: a meeting is one
   connection. */
typedef struct {
  uint64_t id;
  int32_t pid;
} met_rec;

static void met_path(uint64_t id, uint32_t peer_rank, char *out, size_t n) {
  snprintf(out, n, "%s/met-%016llx-r%u", sim_dir(), (unsigned long long)id, peer_rank);
}

static met_rec read_met(uint64_t id, uint32_t peer_rank) {
  char path[400];
  met_rec peer = {0, 0};
  met_path(id, peer_rank, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return peer;
  if (read(fd, &peer, sizeof peer) != (ssize_t)sizeof peer) peer.id = 0;
  close(fd);
  return peer;
}

static int write_met(uint64_t id, uint32_t peer_rank, uint64_t peer, int32_t pid) {
  char path[400];
  met_rec rec = {peer, pid};
  met_path(id, peer_rank, path, sizeof path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  int ok = write(fd, &rec, sizeof rec) == (ssize_t)sizeof rec;
  close(fd);
  return ok ? 0 : -1;
}

static int lock_dir(void) {
  int dir = open(sim_dir(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0 && flock(dir, LOCK_EX)) {
    close(dir);
    return -1;
  }
  return dir;
}

static void unlock_dir(int dir) {
  flock(dir, LOCK_UN);
  close(dir);
}

/* R15: meet rank r's communicator of this name if it can be met now: 1 met (c->met[r] set), 0 not yet, -1 error.
   `leaving`: the Prepare gives up unless the other end met this one meanwhile (then the connection stands); it
   publishes that it is out of Prepare, so nothing meets it later. */
static int try_meet(comm_t *c, uint32_t r, int leaving) {
  int dir = lock_dir();
  if (dir < 0) return -1;
  int met = 0;
  met_rec peer = read_met(c->id, r);
  if (peer.id && kill(peer.pid, 0) == 0) { /* the other end made the connection (and lives): this one met that */
    c->met[r] = peer.id;
    met = 1;
  } else if (leaving) {
    pthread_mutex_lock(&c->lock);
    publish_locked(c); /* prepared 0: out of Prepare */
    pthread_mutex_unlock(&c->lock);
  } else {
    pub_head h;
    pub_entry *e = NULL;
    if (read_peer(c, r, &h, &e) == 0) {
      free(e);
      /* in its Prepare, alive, and met by nobody at this rank yet: whichever instance of the name it is */
      if (h.prepared && kill(h.pid, 0) == 0 && !read_met(h.id, c->rank).id) {
        met = write_met(c->id, r, h.id, h.pid) || write_met(h.id, c->rank, c->id, (int32_t)getpid()) ? -1 : 1;
        if (met == 1) c->met[r] = h.id;
      }
    }
  }
  unlock_dir(dir);
  return met;
}

/* R24: this process listens on (NIC address, port) unless another live process does: 0, or -1 */
static int take_listener(const comm_t *c) {
  char path[400];
  snprintf(path, sizeof path, "%s/listen-%s-%d", sim_dir(), c->own_ip, c->own_port);
  int dir = lock_dir();
  if (dir < 0) return -1;
  int32_t owner = 0, me = (int32_t)getpid(), rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &owner, sizeof owner) != (ssize_t)sizeof owner) owner = 0;
    close(fd);
  }
  if (owner && owner != me && kill(owner, 0) == 0) {
    fprintf(stderr, "SIMULATED HCCL: %s:%d is listened on by process %d already (one HCCL listener per NIC address "
                    "and device port)\n", c->own_ip, c->own_port, (int)owner);
    rc = -1;
  } else if (owner != me) {
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, &me, sizeof me) != (ssize_t)sizeof me) rc = -1;
    if (fd >= 0) close(fd);
  }
  unlock_dir(dir);
  return rc;
}

/* R27: rank r is reached over RoCE (1) or HCCS (0), as hcomm's IsUsedRdma decides */
static int uses_roce(const comm_t *c, uint32_t r) {
  const char *sw = getenv("HCCL_INTRA_ROCE_ENABLE");
  int intra = sw && *sw && atol(sw) != 0;
  uint32_t me = c->rank < MAX_TABLE_DEVS ? c->rank : 0, peer = r < MAX_TABLE_DEVS ? r : 0;
  if (simacl_is_a2()) return intra || strcmp(c->servers[me], c->servers[peer]) != 0; /* R27 A2 */
  if (simacl_is_a3()) return intra || strcmp(c->pods[me], c->pods[peer]) != 0;
  return 1;
}

/* the checks of Prepare before it connects (R20-R22, R24, R27): HCCL_SUCCESS or the code it fails with */
static HcclResult open_nic(comm_t *c, long seconds) {
  if (simacl_is_a3() && !c->v12) return HCCL_E_INTERNAL; /* R21: a 1.0 table on an A3 */
  for (int i = 0; i < c->nbound; i++)
    if (c->bound[i]->region.size > (64ull << 30)) return HCCL_E_PARA; /* R22: 64 GiB per range */
  c->hccs = c->roce = 0;
  for (uint32_t r = 0; r < c->nranks; r++)
    if (r != c->rank) *(uses_roce(c, r) ? &c->roce : &c->hccs) += 1;
  if (c->hccs && c->v12 && simacl_is_a3()) { /* R20: vNIC addresses by super device id (HCCS peers only) */
    const char *base = getenv("ASCEND_SIM_SUPER_DEVICE_BASE");
    if (atoll(c->own_sdid) != (base && *base ? atoll(base) : 0) + c->device) return HCCL_E_INTERNAL;
  }
  if (!c->roce) return HCCL_SUCCESS; /* R27: no RoCE peer: the NIC is neither opened nor listened on */
  char nic[64];
  if (simacl_nic_address(c->device, nic, sizeof nic) || strcmp(nic, c->own_ip) != 0) { /* R20 */
    fprintf(stderr, "SIMULATED HCCL: no NIC of NPU %d has address %s (its hccn.conf address: %s); waiting the "
                    "timeout, as hccp does\n", c->device, c->own_ip,
            simacl_nic_address(c->device, nic, sizeof nic) ? "none" : nic);
    sleep((unsigned)(seconds >= 0 ? seconds : env_long("HCCL_CONNECT_TIMEOUT", 120)));
    return HCCL_E_TIMEOUT;
  }
  if (take_listener(c)) return HCCL_E_NETWORK; /* R24 */
  return HCCL_SUCCESS;
}

HcclResult HcclCommPrepare(HcclComm comm, HcclPrepareConfig *prepareConfig, int32_t timeout) {
  comm_t *c = comm;
  if (!c || !prepareConfig) return HCCL_E_PTR;
  /* R1: seconds (hccl_one_sided_services.h "单位秒"); -1 for ever; 0 the default connect timeout */
  if (timeout < -1) return HCCL_E_PARA;
  long seconds = timeout == 0 ? env_long("HCCL_CONNECT_TIMEOUT", 120) : timeout;
  pthread_mutex_lock(&c->lock);
  if (c->prepared) { /* R5: prepared already: nothing new is exchanged */
    pthread_mutex_unlock(&c->lock);
    return HCCL_SUCCESS;
  }
  HcclResult nic = open_nic(c, seconds);
  if (nic != HCCL_SUCCESS) {
    pthread_mutex_unlock(&c->lock);
    return nic;
  }
  c->nenabled = 0; /* R3: what is bound now is what the peer will reach */
  for (int i = 0; i < c->nbound; i++) c->enabled[c->nenabled++] = c->bound[i]->region;
  pthread_mutex_lock(&g_lock);
  c->nic_epoch = g_nic_epoch[c->device];
  pthread_mutex_unlock(&g_lock);
  c->prepared = 1;
  HcclResult ret = publish_locked(c);
  c->prepared = 0;
  if (ret == HCCL_SUCCESS) __atomic_store_n(&c->preparing, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&c->lock);
  if (ret != HCCL_SUCCESS) return ret;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (uint32_t r = 0; r < c->nranks; r++) { /* every rank meets here (R15) */
    if (r == c->rank) continue;
    for (;;) {
      clock_gettime(CLOCK_MONOTONIC, &now);
      double waited = (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9;
      int leaving = seconds >= 0 && waited >= (double)seconds;
      int met = try_meet(c, r, leaving);
      if (met == 1) break;
      if (met < 0 || leaving) {
        __atomic_store_n(&c->preparing, 0, __ATOMIC_SEQ_CST);
        return met < 0 ? HCCL_E_INTERNAL : HCCL_E_TIMEOUT;
      }
      usleep(1000);
    }
  }
  pthread_mutex_lock(&c->lock);
  c->prepared = 1;
  __atomic_store_n(&c->preparing, 0, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&c->lock);
  return HCCL_SUCCESS;
}

HcclResult HcclCommDestroy(HcclComm comm) {
  comm_t *c = comm;
  if (!c) return HCCL_E_PTR;
  if (during_prepare(c, "HcclCommDestroy")) return HCCL_E_INTERNAL;
  pthread_mutex_lock(&c->lock);
  int bound = c->nbound;
  pthread_mutex_unlock(&c->lock);
  if (bound) return HCCL_E_PARA; /* R8: memory still bound: HcclCommUnbindMem first */
  pthread_mutex_lock(&g_lock);
  for (comm_t **pp = &g_comms; *pp; pp = &(*pp)->next)
    if (*pp == c) { *pp = c->next; break; }
  pthread_mutex_unlock(&g_lock);
  char path[400];
  pub_path(c, c->rank, path, sizeof path);
  unlink(path);
  for (uint32_t r = 0; r < c->nranks; r++) { /* this end's meetings go with it (R16: the peer's connection dies) */
    met_path(c->id, r, path, sizeof path);
    if (r != c->rank) unlink(path);
  }
  for (int i = 0; i < c->nmaps; i++) munmap(c->maps[i].base, c->maps[i].size);
  pthread_mutex_destroy(&c->lock);
  free(c->met);
  free(c);
  return HCCL_SUCCESS;
}

/* R4: this rank's memory enabled at Prepare holding [p, p+n) -- all of it in one buffer: its backing, or NULL */
static void *local_backing(comm_t *c, uintptr_t p, uint64_t n) {
  for (int i = 0; i < c->nenabled; i++) {
    sim_region *r = &c->enabled[i];
    if (sim_inside(r->addr, r->size, p, n)) return (char *)r->backing + (p - r->addr);
  }
  return NULL;
}

/* R4: the peer's memory enabled at its Prepare holding [p, p+n) in one buffer, mapped here: its address, or NULL */
static void *remote_backing(comm_t *c, const pub_entry *entries, uint32_t count, uintptr_t p, uint64_t n) {
  for (uint32_t i = 0; i < count; i++) {
    const pub_entry *e = &entries[i];
    if (!sim_inside(e->addr, e->size, p, n)) continue;
    for (int m = 0; m < c->nmaps; m++) {
      mapping *map = &c->maps[m];
      if (strcmp(map->file, e->file) == 0 && map->offset <= e->file_offset &&
          e->file_offset + e->size <= map->offset + map->size)
        return (char *)map->base + (e->file_offset - map->offset) + (p - e->addr);
    }
    if (c->nmaps == MAX_MAPS) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = e->file_offset & ~(uint64_t)(page - 1), len = e->file_offset + e->size - start;
    int fd = open(e->file, O_RDWR | O_CLOEXEC);
    if (fd < 0) return NULL;
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    close(fd);
    if (base == MAP_FAILED) return NULL;
    mapping *map = &c->maps[c->nmaps++];
    snprintf(map->file, sizeof map->file, "%s", e->file);
    map->offset = start;
    map->size = len;
    map->base = base;
    return (char *)base + (e->file_offset - start) + (p - e->addr);
  }
  return NULL;
}

static uint64_t type_size(int t) {
  static const uint64_t sizes[] = {1, 2, 4, 2, 4, 8, 8, 1, 2, 4, 8, 2};
  return t >= 0 && t < (int)(sizeof sizes / sizeof sizes[0]) ? sizes[t] : 0;
}

typedef struct {
  void *stream;
  int32_t peer;    /* the remote rank's process */
  uint64_t rate;   /* bytes per second on the simulated wire; 0 = no limit */
  uint32_t n;
  struct { void *dst; const void *src; uint64_t len; } ops[];
} copy_job;

#define WIRE_CHUNK (64u << 10)

static uint64_t wire_rate(void) {
  const char *s = getenv("ASCEND_SIM_WIRE_MBPS");
  long mbps = s ? atol(s) : 0;
  return mbps > 0 ? (uint64_t)mbps * 1000000u / 8u : 0;
}

static int peer_gone(int32_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

static double seconds_since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

/* the stream's task: the bytes of one batch, chunk by chunk at the wire's pace; stalls once the peer is gone */
static void run_copies(void *arg) {
  copy_job *j = arg;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint64_t moved = 0;
  for (uint32_t i = 0; i < j->n; i++) {
    for (uint64_t at = 0; at < j->ops[i].len;) {
      if (simacl_stream_stopping(j->stream)) return;
      if (peer_gone(j->peer)) { /* nothing more lands; the initiator's synchronisation times out */
        while (!simacl_stream_stopping(j->stream)) usleep(1000);
        return;
      }
      uint64_t len = j->ops[i].len - at < WIRE_CHUNK ? j->ops[i].len - at : WIRE_CHUNK;
      memcpy((char *)j->ops[i].dst + at, (const char *)j->ops[i].src + at, len);
      at += len;
      moved += len;
      if (j->rate) {
        double ahead = (double)moved / (double)j->rate - seconds_since(&t0);
        if (ahead > 0) usleep((useconds_t)(ahead * 1e6));
      }
    }
  }
}

static HcclResult one_sided(HcclComm comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum,
                            aclrtStream stream, int put) {
  comm_t *c = comm;
  if (!c || !stream || (descNum && !desc)) return HCCL_E_PTR;
  /* R2: hcomm one_sided_service_adapt.cc HcclBatchParaCheck: descNum > MAX_DESC_NUM (256) is HCCL_E_PARA */
  if (descNum > (uint32_t)env_long("ASCEND_SIM_MAX_DESC", 256)) return HCCL_E_PARA;
  if (remoteRank >= c->nranks || remoteRank == c->rank) return HCCL_E_PARA;
  if (!c->prepared) return HCCL_E_INTERNAL; /* HcclCommPrepare first */
  pthread_mutex_lock(&g_lock);
  int nic_gone = g_nic_epoch[c->device] != c->nic_epoch;
  pthread_mutex_unlock(&g_lock);
  if (nic_gone) return HCCL_E_NETWORK; /* R7: the device's NIC went with its last registration */
  pub_head h;
  pub_entry *entries = NULL;
  if (read_peer(c, remoteRank, &h, &entries)) return HCCL_E_NETWORK;  /* the peer's communicator is gone */
  if (h.id != c->met[remoteRank]) { /* R16: not the instance its Prepare met: that one is gone */
    free(entries);
    return HCCL_E_NETWORK;
  }
  if (peer_gone(h.pid)) {
    free(entries);
    return HCCL_E_NETWORK;
  }
  copy_job *j = calloc(1, sizeof *j + sizeof j->ops[0] * (descNum ? descNum : 1));
  if (!j) {
    free(entries);
    return HCCL_E_MEMORY;
  }
  j->stream = stream;
  j->peer = h.pid;
  j->rate = wire_rate();
  HcclResult ret = HCCL_SUCCESS;
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < descNum && ret == HCCL_SUCCESS; i++) {
    uint64_t unit = type_size(desc[i].dataType);
    if (!unit || !desc[i].localAddr || !desc[i].remoteAddr) {
      ret = HCCL_E_PARA;
      break;
    }
    uint64_t len = desc[i].count * unit;
    void *local = local_backing(c, (uintptr_t)desc[i].localAddr, len);
    void *remote = remote_backing(c, entries, h.count, (uintptr_t)desc[i].remoteAddr, len);
    if (!local || !remote) {
      ret = HCCL_E_INTERNAL; /* R4: "Can't find remoteBuffer by key" (or the local buffer) */
      break;
    }
    j->ops[i].dst = put ? remote : local;
    j->ops[i].src = put ? local : remote;
    j->ops[i].len = len;
    j->n = i + 1;
  }
  pthread_mutex_unlock(&c->lock);
  free(entries);
  /* R11: the descriptors before a bad one were enqueued already (hcomm writes them to the stream one by one) */
  if (!j->n) {
    free(j);
  } else if (simacl_enqueue(stream, run_copies, j)) { /* enqueued, j is the stream's (it may be gone already) */
    if (ret == HCCL_SUCCESS) ret = HCCL_E_INTERNAL;
    free(j);
  }
  return ret;
}

HcclResult HcclBatchPut(HcclComm comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum,
                        aclrtStream stream) {
  return one_sided(comm, remoteRank, desc, descNum, stream, 1);
}

HcclResult HcclBatchGet(HcclComm comm, uint32_t remoteRank, HcclOneSideOpDesc *desc, uint32_t descNum,
                        aclrtStream stream) {
  return one_sided(comm, remoteRank, desc, descNum, stream, 0);
}
