/* Shared by the two SIMULATED libraries (ascendcl.c, hccl.c): test code, not Huawei's. */
#ifndef DATADIST_SIM_H
#define DATADIST_SIM_H
#include <stddef.h>
#include <stdint.h>

enum { SIM_DEVICE = 1, SIM_HOST = 2 };

/* memory the simulated runtime knows in this process: `size` bytes at the address handed out (`addr`),
   reachable by the runtime at `backing`, stored in `file` from `file_offset` */
typedef struct {
  uintptr_t addr;
  uint64_t size;
  void *backing;
  int kind, device, owned;
  char file[200];
  uint64_t file_offset;
  char key[72];
} sim_region;

/* [p, p+n) lies inside the `size` bytes at `base` (no overflow) */
static inline int sim_inside(uint64_t base, uint64_t size, uint64_t p, uint64_t n) {
  return p >= base && p - base <= size && n <= size - (p - base);
}

int simacl_resolve(const void *p, uint64_t n, sim_region *out);
/* the PHYSICAL NPU of the calling thread's context (-1 without one) */
int simacl_current_device(void);
/* the SoC is an A3 (ASCEND_SIM_SOC_VERSION Ascend910_93xx) */
int simacl_is_a3(void);
/* the SoC is an A2 (Ascend910B*: hcomm's DEV_TYPE_910B) */
int simacl_is_a2(void);
/* the NIC address of physical NPU `phys` in the node's hccn.conf (ASCEND_SIM_HCCN_CONF): 0, or -1 if it has none */
int simacl_nic_address(int phys, char *out, size_t n);
int simacl_enqueue(void *stream, void (*run)(void *), void *arg);
/* the stream is being aborted or destroyed: a long task (a paced put) should stop now */
int simacl_stream_stopping(void *stream);

#endif
