/* A SIMULATED libascendcl.so for tests: no NPU, no CANN. Written by datadist, not Huawei's code.
 *
 * It exports the ACL runtime functions datadist calls, with the prototypes of CANN's public
 * acl_rt.h, and checks what the real runtime checks, returning CANN's aclError codes:
 *
 *   - "device memory" is shared memory: every aclrtMalloc is a file in $ASCEND_SIM_DIR mapped twice,
 *     once PROT_NONE at the address handed out (a host load or store through a device pointer
 *     faults, as on an NPU) and once read-write for the runtime's own copies;
 *   - a thread must aclrtSetDevice before it allocates, copies or makes a stream (per-thread context);
 *   - aclrtMemcpy(Async) checks the kind against where both pointers really are, destMax, bounds, that device
 *     memory is on the thread's device; IPC export and import, and HCCL's bind, check the device too;
 *   - IPC: aclrtIpcMemGetExportKey / SetImportPid / ImportByKey / Close, with the pid white list
 *     (flags 0): only a process whose pid AS THE DEVICE DRIVER SEES IT was set may import -- its bare tgid
 *     (aclrtDeviceGetBareTgid), which differs from getpid() in a container with its own PID namespace or in a VM
 *     (R12; hicann/runtime memory.cpp: the allow list is the driver's; knob ASCEND_SIM_TGID_OFFSET: bare tgid =
 *     getpid() + offset, a simulated PID namespace);
 *   - aclrtIpcMemClose and aclrtIpcMemSetImportPid need a current context in the calling thread (R13; hicann/runtime
 *     api_impl.cc SetIpcMemPid, api_impl_standard_soc.cc IpcCloseMemoryByName: RT_ERROR_CONTEXT_NULL);
 *   - an export key is open until its EXPORTER closes it: the file $ASCEND_SIM_DIR/ipc-k<exporter pid>-<serial>-...,
 *     so a test counts the keys a process left open (tests.sim.open_export_keys); aclrtIpcMemClose of a key the
 *     calling process did not import destroys it (hicann/runtime api_impl.cc IpcCloseMemoryByName: a name not in
 *     the process's import map goes to the driver's DestroyIpcMem), and importing a destroyed key fails (R26; the
 *     code is the driver's, here ACL_ERROR_INVALID_PARAM as for any unknown key); what an import already made keeps
 *     is the driver's (tests/hw/first_hour.py exporter_closes_first), here: its mapping;
 *   - streams run their work on a thread; aclrtSynchronizeStreamWithTimeout waits with a deadline;
 *     aclrtStreamAbort stops the running task (at its next check) and discards the queued ones, and returns
 *     when they are gone -- the stream is usable again, a synchronisation it interrupted fails.
 *
 * The node (one simulated server), described once, named as CANN names things:
 *   - ASCEND_SIM_DEVICES physical NPUs (default 8); ASCEND_RT_VISIBLE_DEVICES as the runtime honours it: a
 *     comma-separated list of physical ids, the process's logical id i is the i-th (an id that is not a physical
 *     NPU ends the list); aclrtGetDeviceCount, aclrtSetDevice and aclrtGetPhyDevIdByLogicDevId follow it. Every
 *     allocation, IPC export and import and stream belongs to a PHYSICAL NPU (a thread's context is its logical
 *     device's physical one), and is written to $ASCEND_SIM_DIR/ledger ("<pid> <call> npu<physical> ...") so a test
 *     can tell where a pool or an import landed;
 *   - ASCEND_SIM_SOC_VERSION: what aclrtGetSocName says (default "Ascend910B1", an A2; "Ascend910_9391" is an A3);
 *     on an A3 aclrtGetDeviceInfo answers ACL_DEV_ATTR_SUPER_POD_ID (405) with ASCEND_SIM_SUPER_POD_ID (default 0)
 *     and ACL_DEV_ATTR_SUPER_POD_DEVICE_ID (403) with ASCEND_SIM_SUPER_DEVICE_BASE + physical id (hixl
 *     rank_table_generator_v2.cc reads both for the 1.2 rank table); on an A2 both are ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
 *   - ASCEND_SIM_HCCN_CONF: the node's /etc/hccn.conf (address_<physical id>=<ip>, each NPU's NIC address); the
 *     simulated hccn_tool (bin/hccn_tool of the built tree) answers `-i <physical id> -ip -g` from it, and libhccl
 *     opens an NPU's NIC only by that address (hccl.c R20).
 * Other knobs: ASCEND_SIM_DIR (required: where memory files live), ASCEND_SIM_HBM_MB (per device and process,
 * default 4096), ASCEND_SIM_TGID_OFFSET (a simulated PID namespace, default 0); libhccl's ASCEND_SIM_WIRE_MBPS (hccl.c).
 * libhccl.so (hccl.c) links to this library and reaches device memory through simacl_* below.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

typedef int aclError;
typedef void *aclrtStream;

#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_STREAM_ABORT 107023
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_NO_PERMISSION 207006
#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046

enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, KIND_DEFAULT = 4 };

#define MAX_REGIONS 4096

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_region g_regions[MAX_REGIONS];
static int g_count;
static uint64_t g_serial;
static uint64_t g_used[64];
static __thread int t_device = -1;

static const char *sim_dir(void) {
  const char *d = getenv("ASCEND_SIM_DIR");
  return d && *d ? d : NULL;
}

/* the node's physical NPUs */
static int physical_count(void) {
  const char *s = getenv("ASCEND_SIM_DEVICES");
  int n = s ? atoi(s) : 8;
  return n > 0 && n <= 64 ? n : 8;
}

/* this process's logical devices: phys[i] is logical i's physical NPU (ASCEND_RT_VISIBLE_DEVICES, else all) */
static int visible(int *phys) {
  int total = physical_count(), n = 0;
  const char *s = getenv("ASCEND_RT_VISIBLE_DEVICES");
  if (!s) {
    for (; n < total; n++) phys[n] = n;
    return n;
  }
  while (*s && n < 64) {
    char *end;
    long id = strtol(s, &end, 10);
    if (end == s || id < 0 || id >= total) break; /* not a physical NPU: the list ends here */
    phys[n++] = (int)id;
    s = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end) break;
  }
  return n;
}

static int device_count(void) {
  int phys[64];
  return visible(phys);
}

/* the physical NPU of logical device `d` of this process, -1 if there is none */
static int physical_of(int d) {
  int phys[64], n = visible(phys);
  return d >= 0 && d < n ? phys[d] : -1;
}


/* one line of $ASCEND_SIM_DIR/ledger: what this process did on which physical NPU */
static void ledger(const char *call, int phys, const void *addr, uint64_t size, const char *key) {
  const char *dir = getenv("ASCEND_SIM_DIR");
  if (!dir) return;
  char path[300], line[300];
  snprintf(path, sizeof path, "%s/ledger", dir);
  int n = snprintf(line, sizeof line, "%d %s npu%d %#llx %llu %s\n", (int)getpid(), call, phys,
                   (unsigned long long)(uintptr_t)addr, (unsigned long long)size, key ? key : "-");
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) != n) { /* best effort: a test reading it fails on the missing line */ }
  close(fd);
}

static uint64_t hbm_bytes(void) {
  const char *s = getenv("ASCEND_SIM_HBM_MB");
  long mb = s ? atol(s) : 4096;
  return (uint64_t)(mb > 0 ? mb : 4096) << 20;
}

/* the region of this process that [p, p+n) lies in, under g_lock; NULL if none */
static sim_region *find_locked(uintptr_t p, uint64_t n) {
  for (int i = 0; i < g_count; i++) {
    sim_region *r = &g_regions[i];
    if (sim_inside(r->addr, r->size, p, n)) return r;
  }
  return NULL;
}

int simacl_resolve(const void *p, uint64_t n, sim_region *out) {
  pthread_mutex_lock(&g_lock);
  sim_region *r = find_locked((uintptr_t)p, n);
  if (r) *out = *r;
  pthread_mutex_unlock(&g_lock);
  return r != NULL;
}

int simacl_current_device(void) { return t_device; }

/* a new file of `size` bytes in the sim directory, mapped read-write; 0 or an aclError */
static aclError new_file(uint64_t size, char *name, size_t name_len, void **backing) {
  const char *dir = sim_dir();
  if (!dir) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  pthread_mutex_lock(&g_lock);
  uint64_t serial = ++g_serial;
  pthread_mutex_unlock(&g_lock);
  snprintf(name, name_len, "%s/mem-%d-%llu", dir, (int)getpid(), (unsigned long long)serial);
  int fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    unlink(name);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (b == MAP_FAILED) {
    unlink(name);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  *backing = b;
  return ACL_SUCCESS;
}

static aclError add_region(sim_region *r) {
  pthread_mutex_lock(&g_lock);
  if (g_count == MAX_REGIONS) {
    pthread_mutex_unlock(&g_lock);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  g_regions[g_count++] = *r;
  pthread_mutex_unlock(&g_lock);
  return ACL_SUCCESS;
}

static void drop_region_locked(sim_region *r) {
  *r = g_regions[--g_count];
}

/* ---- init, devices ---- */

static int g_inited;

aclError aclInit(const char *configPath) {
  (void)configPath;
  if (!sim_dir()) return ACL_ERROR_INVALID_PARAM;
  if (__sync_lock_test_and_set(&g_inited, 1)) return ACL_ERROR_REPEAT_INITIALIZE;
  return ACL_SUCCESS;
}

aclError aclFinalize(void) {
  g_inited = 0;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t *count) {
  if (!count) return ACL_ERROR_INVALID_PARAM;
  *count = (uint32_t)device_count();
  return ACL_SUCCESS;
}

/* a thread's context is that of its logical device's PHYSICAL NPU: t_device holds the physical id, and so does
   every region, export and stream (what two processes with different visible devices must agree on) */
aclError aclrtSetDevice(int32_t deviceId) {
  int phys = physical_of(deviceId);
  if (phys < 0) return ACL_ERROR_RT_INVALID_DEVICEID;
  t_device = phys;
  ledger("aclrtSetDevice", phys, NULL, 0, NULL); /* each call takes a reference on the primary context */
  return ACL_SUCCESS;
}

/* the calling thread's device, as this process's logical id; ACL_ERROR_RT_CONTEXT_NULL without one */
aclError aclrtGetDevice(int32_t *deviceId) {
  if (!deviceId) return ACL_ERROR_INVALID_PARAM;
  int phys[64], n = visible(phys);
  for (int i = 0; t_device >= 0 && i < n; i++)
    if (phys[i] == t_device) {
      *deviceId = i;
      return ACL_SUCCESS;
    }
  return ACL_ERROR_RT_CONTEXT_NULL;
}

aclError aclrtResetDevice(int32_t deviceId) {
  int phys = physical_of(deviceId);
  if (phys < 0) return ACL_ERROR_RT_INVALID_DEVICEID;
  if (t_device == phys) t_device = -1;
  return ACL_SUCCESS;
}

aclError aclrtGetPhyDevIdByLogicDevId(const int32_t logicDevId, int32_t *const phyDevId) {
  if (!phyDevId) return ACL_ERROR_INVALID_PARAM;
  int phys = physical_of(logicDevId);
  if (phys < 0) return ACL_ERROR_RT_INVALID_DEVICEID;
  *phyDevId = phys;
  return ACL_SUCCESS;
}

static const char *soc_name(void) {
  const char *s = getenv("ASCEND_SIM_SOC_VERSION");
  return s && *s ? s : "Ascend910B1";
}

const char *aclrtGetSocName(void) { return soc_name(); }

/* an A3 (Ascend910_93xx: hixl hixl_utils.cc kSocV3) */
int simacl_is_a3(void) { return strncmp(soc_name(), "Ascend910_93", 12) == 0; }
int simacl_is_a2(void) { return strncmp(soc_name(), "Ascend910B", 10) == 0; }

int simacl_nic_address(int phys, char *out, size_t n) {
  const char *path = getenv("ASCEND_SIM_HCCN_CONF");
  FILE *f = path && *path ? fopen(path, "re") : NULL;
  if (!f) return -1;
  char line[256], want[32];
  int len = snprintf(want, sizeof want, "address_%d=", phys), found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    if (strncmp(line, want, (size_t)len) != 0) continue;
    line[strcspn(line, "\r\n")] = 0;
    snprintf(out, n, "%s", line + len);
    found = 0;
  }
  fclose(f);
  return found;
}

#define ATTR_SUPER_POD_DEVICE_ID 403
#define ATTR_SUPER_POD_ID 405

aclError aclrtGetDeviceInfo(uint32_t deviceId, int attr, int64_t *value) {
  if (!value) return ACL_ERROR_INVALID_PARAM;
  int phys = physical_of((int)deviceId);
  if (phys < 0) return ACL_ERROR_RT_INVALID_DEVICEID;
  if (attr != ATTR_SUPER_POD_DEVICE_ID && attr != ATTR_SUPER_POD_ID) return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
  if (!simacl_is_a3()) return ACL_ERROR_RT_FEATURE_NOT_SUPPORT; /* no super pod on an A2 */
  const char *s = getenv(attr == ATTR_SUPER_POD_ID ? "ASCEND_SIM_SUPER_POD_ID" : "ASCEND_SIM_SUPER_DEVICE_BASE");
  *value = (s && *s ? atoll(s) : 0) + (attr == ATTR_SUPER_POD_ID ? 0 : phys);
  return ACL_SUCCESS;
}

/* R12: the pid the device driver knows this process by (the host's, not this PID namespace's) */
static int32_t bare_tgid(void) {
  const char *s = getenv("ASCEND_SIM_TGID_OFFSET");
  return (int32_t)getpid() + (s && *s ? atoi(s) : 0);
}

aclError aclrtDeviceGetBareTgid(int32_t *pid) {
  if (!pid) return ACL_ERROR_INVALID_PARAM;
  *pid = bare_tgid();
  return ACL_SUCCESS;
}

/* ---- memory ---- */

aclError aclrtMalloc(void **devPtr, size_t size, int policy) {
  if (!devPtr || size == 0 || policy < 0) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  pthread_mutex_lock(&g_lock);
  int over = g_used[t_device] + size > hbm_bytes();
  if (!over) g_used[t_device] += size;
  pthread_mutex_unlock(&g_lock);
  if (over) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  sim_region r = {0};
  void *backing;
  aclError err = new_file(size, r.file, sizeof r.file, &backing);
  if (err == ACL_SUCCESS) {
    int fd = open(r.file, O_RDWR | O_CLOEXEC);
    void *va = fd < 0 ? MAP_FAILED : mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (va == MAP_FAILED) {
      munmap(backing, size);
      unlink(r.file);
      err = ACL_ERROR_RT_MEMORY_ALLOCATION;
    } else {
      r.addr = (uintptr_t)va;
      r.size = size;
      r.backing = backing;
      r.kind = SIM_DEVICE;
      r.device = t_device;
      r.owned = 1;
      err = add_region(&r);
      if (err == ACL_SUCCESS) {
        *devPtr = va;
        ledger("aclrtMalloc", t_device, va, size, NULL);
      }
    }
  }
  if (err != ACL_SUCCESS) {
    pthread_mutex_lock(&g_lock);
    g_used[t_device] -= size;
    pthread_mutex_unlock(&g_lock);
  }
  return err;
}

static aclError free_region(void *p, int kind) {
  pthread_mutex_lock(&g_lock);
  sim_region *r = find_locked((uintptr_t)p, 0);
  if (!r || r->addr != (uintptr_t)p || r->kind != kind || !r->owned) {
    pthread_mutex_unlock(&g_lock);
    return ACL_ERROR_INVALID_PARAM;
  }
  sim_region copy = *r;
  drop_region_locked(r);
  if (kind == SIM_DEVICE) g_used[copy.device] -= copy.size;
  pthread_mutex_unlock(&g_lock);
  if (kind == SIM_DEVICE) ledger("aclrtFree", copy.device, p, copy.size, NULL);
  if (copy.backing != (void *)copy.addr) munmap(copy.backing, copy.size);
  munmap((void *)copy.addr, copy.size);
  unlink(copy.file);
  return ACL_SUCCESS;
}

aclError aclrtFree(void *devPtr) { return free_region(devPtr, SIM_DEVICE); }

aclError aclrtMallocHost(void **hostPtr, size_t size) {
  if (!hostPtr || size == 0) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  sim_region r = {0};
  void *backing;
  aclError err = new_file(size, r.file, sizeof r.file, &backing);
  if (err != ACL_SUCCESS) return err;
  r.addr = (uintptr_t)backing; /* host memory: the address is readable and writable */
  r.size = size;
  r.backing = backing;
  r.kind = SIM_HOST;
  r.device = t_device;
  r.owned = 1;
  err = add_region(&r);
  if (err != ACL_SUCCESS) {
    munmap(backing, size);
    unlink(r.file);
    return err;
  }
  *hostPtr = backing;
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void *hostPtr) { return free_region(hostPtr, SIM_HOST); }

/* where `p` (count bytes) really is: 1 device (backing in *real), 0 host (anything not device memory); *bad
   when it is device memory past its allocation or on another device than the thread's */
static int where(const void *p, size_t count, void **real, int *bad) {
  sim_region r;
  *bad = 0;
  if (simacl_resolve(p, count, &r) && r.kind == SIM_DEVICE) {
    *real = (char *)r.backing + ((uintptr_t)p - r.addr);
    *bad = r.device != t_device;
    return 1;
  }
  /* a device pointer with a range running past its allocation */
  if (simacl_resolve(p, 0, &r) && r.kind == SIM_DEVICE) *bad = 1;
  *real = (void *)p;
  return 0;
}

/* the checks of a copy (aclrtMemcpy and aclrtMemcpyAsync): where the bytes really are (*rd, *rs), whether both
   sides are device memory (*d2d); count 0 answers ACL_SUCCESS with *rd NULL */
static aclError check_copy(void *dst, size_t destMax, const void *src, size_t count, int kind, void **rd, void **rs,
                           int *d2d) {
  *rd = NULL;
  if (!dst || !src || count > destMax || kind < H2H || kind > KIND_DEFAULT) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  if (count == 0) return ACL_SUCCESS;
  int bad_d, bad_s;
  int dd = where(dst, count, rd, &bad_d), sd = where(src, count, rs, &bad_s);
  if (bad_d || bad_s) return ACL_ERROR_INVALID_PARAM;
  if (kind != KIND_DEFAULT && (dd != (kind == H2D || kind == D2D) || sd != (kind == D2H || kind == D2D)))
    return ACL_ERROR_INVALID_PARAM; /* the kind does not say where the pointers are */
  *d2d = dd && sd;
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, int kind) {
  void *rd, *rs;
  int d2d = 0;
  aclError err = check_copy(dst, destMax, src, count, kind, &rd, &rs, &d2d);
  if (err == ACL_SUCCESS && rd) memmove(rd, rs, count);
  return err;
}

typedef struct {
  void *dst;
  const void *src;
  size_t count;
} copy_job;

static void run_copy(void *arg) {
  copy_job *j = arg;
  memmove(j->dst, j->src, j->count);
}

/* the copy on `stream` (after what is queued there); checked as aclrtMemcpy is, and device to device both
   addresses 64-byte aligned (acl_rt.h's restriction of the asynchronous copy) */
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, int kind, aclrtStream stream) {
  void *rd, *rs;
  int d2d = 0;
  if (!stream) return ACL_ERROR_INVALID_PARAM;
  aclError err = check_copy(dst, destMax, src, count, kind, &rd, &rs, &d2d);
  if (err != ACL_SUCCESS || !rd) return err;
  if (d2d && (((uintptr_t)dst | (uintptr_t)src) & 63)) return ACL_ERROR_INVALID_PARAM;
  copy_job *j = malloc(sizeof *j);
  if (!j) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  j->dst = rd;
  j->src = rs;
  j->count = count;
  if (simacl_enqueue(stream, run_copy, j)) {
    free(j);
    return ACL_ERROR_INVALID_PARAM;
  }
  return ACL_SUCCESS;
}

/* ---- IPC ---- */

#define KEY_LEN 65
#define MAX_PIDS 64

typedef struct {
  char file[200];
  uint64_t offset, size;
  int32_t pids[MAX_PIDS];
  int npids;
  int check_pid;
  int device; /* the exporter's device: an import must be made on the same one */
} ipc_record;

static int key_path(const char *key, char *path, size_t n) {
  const char *dir = sim_dir();
  if (!dir || !key || strlen(key) == 0 || strlen(key) >= KEY_LEN || strchr(key, '/')) return -1;
  snprintf(path, n, "%s/ipc-%s", dir, key);
  return 0;
}

static int read_record(const char *key, ipc_record *rec) {
  char path[300];
  if (key_path(key, path, sizeof path)) return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, rec, sizeof *rec);
  close(fd);
  return n == (ssize_t)sizeof *rec ? 0 : -1;
}

static int write_record(const char *key, const ipc_record *rec, int create) {
  char path[300], tmp[320];
  if (key_path(key, path, sizeof path)) return -1;
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  int ok = write(fd, rec, sizeof *rec) == (ssize_t)sizeof *rec;
  close(fd);
  if (!ok) {
    unlink(tmp);
    return -1;
  }
  if (create && access(path, F_OK) == 0) {
    unlink(tmp);
    return -1;
  }
  return rename(tmp, path);
}

aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags) {
  if (!devPtr || !key || size == 0 || len < KEY_LEN || flags > 1) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  sim_region r;
  if (!simacl_resolve(devPtr, size, &r) || r.kind != SIM_DEVICE || r.device != t_device)
    return ACL_ERROR_INVALID_PARAM;
  ipc_record rec = {0};
  rec.device = t_device;
  snprintf(rec.file, sizeof rec.file, "%s", r.file);
  rec.offset = (uintptr_t)devPtr - r.addr;
  rec.size = size;
  rec.check_pid = flags == 0;
  pthread_mutex_lock(&g_lock);
  uint64_t serial = ++g_serial;
  pthread_mutex_unlock(&g_lock);
  unsigned char rnd[8] = {0};
  int ufd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (ufd >= 0) {
    if (read(ufd, rnd, sizeof rnd) != (ssize_t)sizeof rnd) memset(rnd, 0, sizeof rnd);
    close(ufd);
  }
  char k[KEY_LEN];
  snprintf(k, sizeof k, "k%d-%llu-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(), (unsigned long long)serial,
           rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  if (write_record(k, &rec, 1)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  snprintf(key, len, "%s", k);
  ledger("aclrtIpcMemGetExportKey", t_device, devPtr, size, k);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num) {
  ipc_record rec;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL; /* R13 */
  if (!pid || num == 0 || read_record(key, &rec)) return ACL_ERROR_INVALID_PARAM;
  if (!rec.check_pid) return ACL_ERROR_INVALID_PARAM; /* exported without the white list */
  for (size_t i = 0; i < num; i++) {
    if (rec.npids == MAX_PIDS) return ACL_ERROR_INVALID_PARAM;
    rec.pids[rec.npids++] = pid[i];
  }
  return write_record(key, &rec, 0) ? ACL_ERROR_RT_PARAM_INVALID : ACL_SUCCESS;
}

aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags) {
  ipc_record rec;
  if (!devPtr || flags > 1) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  if (read_record(key, &rec) || rec.device != t_device) return ACL_ERROR_INVALID_PARAM;
  if (rec.check_pid) {
    int allowed = 0;
    for (int i = 0; i < rec.npids; i++) allowed |= rec.pids[i] == bare_tgid(); /* R12 */
    if (!allowed) return ACL_ERROR_RT_NO_PERMISSION;
  }
  int fd = open(rec.file, O_RDWR | O_CLOEXEC);
  if (fd < 0) return ACL_ERROR_INVALID_PARAM; /* freed by its owner */
  long page = sysconf(_SC_PAGESIZE);
  uint64_t start = rec.offset & ~(uint64_t)(page - 1), skip = rec.offset - start;
  void *va = mmap(NULL, rec.size + skip, PROT_NONE, MAP_SHARED, fd, (off_t)start);
  void *backing = mmap(NULL, rec.size + skip, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
  close(fd);
  if (va == MAP_FAILED || backing == MAP_FAILED) {
    if (va != MAP_FAILED) munmap(va, rec.size + skip);
    if (backing != MAP_FAILED) munmap(backing, rec.size + skip);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  sim_region r = {0};
  r.addr = (uintptr_t)va + skip;
  r.size = rec.size;
  r.backing = (char *)backing + skip;
  r.kind = SIM_DEVICE;
  r.device = t_device;
  r.owned = 0;
  snprintf(r.file, sizeof r.file, "%s", rec.file);
  r.file_offset = rec.offset;
  snprintf(r.key, sizeof r.key, "%s", key);
  aclError err = add_region(&r);
  if (err != ACL_SUCCESS) {
    munmap(va, rec.size + skip);
    munmap(backing, rec.size + skip);
    return err;
  }
  *devPtr = (void *)r.addr;
  ledger("aclrtIpcMemImportByKey", t_device, *devPtr, rec.size, key);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemClose(const char *key) {
  char path[300];
  if (key_path(key, path, sizeof path)) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL; /* R13 */
  long page = sysconf(_SC_PAGESIZE);
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_count; i++) { /* the importer closes: unmap what it imported */
    sim_region *r = &g_regions[i];
    if (!r->owned && strcmp(r->key, key) == 0) {
      uint64_t skip = r->addr & (uint64_t)(page - 1);
      munmap((void *)(r->addr - skip), r->size + skip);
      munmap((char *)r->backing - skip, r->size + skip);
      int device = r->device;
      uint64_t size = r->size;
      drop_region_locked(r);
      pthread_mutex_unlock(&g_lock);
      ledger("aclrtIpcMemClose", device, NULL, size, key);
      return ACL_SUCCESS;
    }
  }
  pthread_mutex_unlock(&g_lock);
  ipc_record rec; /* the exporter closes: the key is destroyed, no import of it succeeds after */
  if (read_record(key, &rec)) return ACL_ERROR_INVALID_PARAM;
  unlink(path); /* R26: hicann/runtime api_impl.cc IpcCloseMemoryByName -> the driver's DestroyIpcMem */
  ledger("aclrtIpcMemClose", t_device, NULL, rec.size, key);
  return ACL_SUCCESS;
}

/* the block ptr lies in: a region of this process (allocated, or imported by key: the exported extent) */
aclError aclrtMemGetAddressRange(void *ptr, void **pbase, size_t *psize) {
  if (!ptr || !pbase || !psize) return ACL_ERROR_INVALID_PARAM;
  sim_region r;
  if (!simacl_resolve(ptr, 1, &r)) return ACL_ERROR_INVALID_PARAM;
  *pbase = (void *)r.addr;
  *psize = (size_t)r.size;
  return ACL_SUCCESS;
}

/* ---- streams: a FIFO of jobs run by one thread each ---- */

typedef struct job {
  void (*run)(void *);
  void *arg;
  struct job *next;
} job;

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  job *head, *tail;
  int pending, stop, aborted, device;
  uint64_t aborts; /* aclrtStreamAbort calls that stopped work: a synchronisation they interrupted fails */
  pthread_t thread;
} sim_stream;

static void *stream_main(void *p) {
  sim_stream *s = p;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cond, &s->lock);
    if (!s->head && s->stop) break;
    job *j = s->head;
    s->head = j->next;
    if (!s->head) s->tail = NULL;
    int aborted = s->aborted;
    pthread_mutex_unlock(&s->lock);
    if (!aborted) j->run(j->arg);
    free(j->arg);
    free(j);
    pthread_mutex_lock(&s->lock);
    s->pending--;
    pthread_cond_broadcast(&s->cond);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

aclError aclrtCreateStream(aclrtStream *stream) {
  if (!stream) return ACL_ERROR_INVALID_PARAM;
  if (t_device < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  sim_stream *s = calloc(1, sizeof *s);
  if (!s) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  s->device = t_device;
  if (pthread_create(&s->thread, NULL, stream_main, s)) {
    free(s);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  *stream = s;
  ledger("aclrtCreateStream", t_device, s, 0, NULL);
  return ACL_SUCCESS;
}

int simacl_enqueue(void *stream, void (*run)(void *), void *arg) {
  sim_stream *s = stream;
  job *j = calloc(1, sizeof *j);
  if (!s || !j) {
    free(j);
    return -1;
  }
  j->run = run;
  j->arg = arg;
  pthread_mutex_lock(&s->lock);
  if (s->tail) s->tail->next = j; else s->head = j;
  s->tail = j;
  s->pending++;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  return 0;
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
  sim_stream *s = stream;
  if (!s || timeout < -1) return ACL_ERROR_INVALID_PARAM;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  if (timeout > 0) {
    until.tv_sec += timeout / 1000;
    until.tv_nsec += (long)(timeout % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
  }
  aclError err = ACL_SUCCESS;
  pthread_mutex_lock(&s->lock);
  uint64_t aborts = s->aborts;
  while (s->pending) {
    if (timeout <= 0) { /* -1 and 0: wait for ever, as the real runtime does */
      pthread_cond_wait(&s->cond, &s->lock);
    } else if (pthread_cond_timedwait(&s->cond, &s->lock, &until) == ETIMEDOUT && s->pending) {
      err = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
      break;
    }
  }
  if (err == ACL_SUCCESS && s->aborts != aborts) err = ACL_ERROR_RT_STREAM_ABORT;
  pthread_mutex_unlock(&s->lock);
  return err;
}

aclError aclrtStreamAbort(aclrtStream stream) {
  sim_stream *s = stream;
  if (!s) return ACL_ERROR_INVALID_PARAM;
  pthread_mutex_lock(&s->lock);
  if (s->pending) { /* the running task stops at its next check (simacl_stream_stopping), the rest are dropped */
    s->aborted = 1;
    s->aborts++;
    pthread_cond_broadcast(&s->cond);
    while (s->pending) pthread_cond_wait(&s->cond, &s->lock);
    s->aborted = 0;
  }
  pthread_mutex_unlock(&s->lock);
  return ACL_SUCCESS;
}

int simacl_stream_stopping(void *stream) {
  sim_stream *s = stream;
  pthread_mutex_lock(&s->lock);
  int stopping = s->aborted || s->stop;
  pthread_mutex_unlock(&s->lock);
  return stopping;
}

aclError aclrtDestroyStream(aclrtStream stream) {
  sim_stream *s = stream;
  if (!s) return ACL_ERROR_INVALID_PARAM;
  pthread_mutex_lock(&s->lock);
  s->stop = 1;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
  return ACL_SUCCESS;
}
