// Finding the RDMA device and RoCEv2 GID for the local address that routes to the
// aggregator. A RoCE NIC (or Soft-RoCE's rxe) lists one GID per address of its
// netdev and RoCE version; netreduce needs the IPv4-mapped RoCEv2 one
// (::ffff:a.b.c.d), whose index the queue pair's address vector names.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace netreduce {

struct VerbsDevice {
  ibv_context* ctx = nullptr;  // owned by the caller once found (ibv_close_device)
  std::string name;            // "rxe0", "mlx5_0", ...
  uint8_t port = 1;
  int gid_index = -1;
  ibv_gid gid{};
  ibv_mtu active_mtu = IBV_MTU_1024;
};

// The device with a RoCEv2 GID for `local_ip` (network order). `want` names one
// device ("" = any). Fails with a message listing what was seen.
Status FindVerbsDevice(uint32_t local_ip, const std::string& want, VerbsDevice* out);

inline int MtuBytes(ibv_mtu m) { return 128 << int(m); }  // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5

}  // namespace netreduce
