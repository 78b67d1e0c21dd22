#include "transport/verbs/verbs_device.h"

#include <arpa/inet.h>

#include <cstring>

namespace netreduce {
namespace {

bool MappedV4(const ibv_gid& g, uint32_t ip) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, kPrefix, 12) == 0 && std::memcmp(g.raw + 12, &ip, 4) == 0;
}

}  // namespace

Status FindVerbsDevice(uint32_t local_ip, const std::string& want, VerbsDevice* out) {
  char addr[INET_ADDRSTRLEN];
  in_addr a;
  a.s_addr = local_ip;
  inet_ntop(AF_INET, &a, addr, sizeof(addr));
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list) ibv_free_device_list(list);
    return IoError("no RDMA device (ibv_get_device_list found none); load rdma_rxe and "
                   "`rdma link add rxe0 type rxe netdev <if>` for Soft-RoCE, or use "
                   "NETREDUCE_TRANSPORT=udp");
  }
  std::string seen;
  Status result = IoError("");
  bool found = false;
  for (int d = 0; d < n && !found; ++d) {
    const std::string name = ibv_get_device_name(list[d]);
    if (!want.empty() && name != want) continue;
    ibv_context* ctx = ibv_open_device(list[d]);
    if (ctx == nullptr) {
      seen += " " + name + " (cannot open)";
      continue;
    }
    ibv_device_attr dattr{};
    ibv_query_device(ctx, &dattr);
    for (uint8_t port = 1; port <= dattr.phys_port_cnt && !found; ++port) {
      ibv_port_attr pattr{};
      if (ibv_query_port(ctx, port, &pattr) != 0) continue;
      if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET) continue;
      for (int i = 0; i < pattr.gid_tbl_len && !found; ++i) {
        ibv_gid_entry e{};
        if (ibv_query_gid_ex(ctx, port, uint32_t(i), &e, 0) != 0) continue;
        if (e.gid_type != IBV_GID_TYPE_ROCE_V2 || !MappedV4(e.gid, local_ip)) continue;
        if (pattr.state != IBV_PORT_ACTIVE) {
          seen += " " + name + "/" + std::to_string(port) + " (has the GID, port not ACTIVE)";
          continue;
        }
        out->ctx = ctx;
        out->name = name;
        out->port = port;
        out->gid_index = i;
        std::memcpy(out->gid.raw, e.gid.raw, 16);
        out->active_mtu = pattr.active_mtu;
        found = true;
      }
    }
    if (!found) {
      if (seen.find(" " + name) == std::string::npos) seen += " " + name;
      ibv_close_device(ctx);
    }
  }
  ibv_free_device_list(list);
  if (found) return Status::Ok();
  return IoError("no active RDMA device has a RoCEv2 GID for " + std::string(addr) +
                 " (the address that routes to the aggregator); devices seen:" +
                 (seen.empty() ? std::string(" none matching '" + want + "'") : seen));
}

}  // namespace netreduce
