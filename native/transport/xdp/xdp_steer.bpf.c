// The XDP program of the AF_XDP transport (compiled with clang -target bpf by
// setup.py and embedded in netreduce._native; xdp_program.cc loads it).
//
// It steers one kind of frame into an AF_XDP socket and passes everything else to
// the kernel untouched: an IPv4 (no options, not a fragment) or IPv6 (UDP as the
// next header) datagram, addressed to this device's MAC and, when the transport is
// bound to one address, to that address, whose UDP destination port is data port
// PORT_BASE + q of the aggregator, arriving on receive queue q. Data thread q owns
// port PORT_BASE + q and the socket bound to queue q, so a frame that lands on any
// other queue (RSS picked another) is passed to the kernel, whose UDP socket for that
// port, read by the same thread, takes it: slower, never wrong. Fragments, IP
// options, IPv6 extension headers, ARP, ICMP and the control port's TCP all go to the
// kernel, as does a frame longer than one socket frame when the socket cannot take
// multi-buffer frames (cfg.max_len).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "xdp_steer_abi.h"

struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, NR_XDP_MAX_QUEUES);
  __type(key, __u32);
  __type(value, __u32);
} nr_xsks SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct nr_xdp_config);
} nr_config SEC(".maps");

// Per-CPU counters (enum nr_xdp_counter), summed by the transport for its stats.
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, NR_XDP_COUNTERS);
  __type(key, __u32);
  __type(value, __u64);
} nr_counters SEC(".maps");

static __always_inline int count(__u32 which, int action) {
  __u64* c = bpf_map_lookup_elem(&nr_counters, &which);
  if (c) *c += 1;
  return action;
}

static __always_inline int same_mac(const unsigned char* a, const unsigned char* b) {
  return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
         a[5] == b[5];
}

SEC("xdp.frags")
int nr_steer(struct xdp_md* ctx) {
  void* data = (void*)(long)ctx->data;
  void* end = (void*)(long)ctx->data_end;
  __u32 zero = 0;
  struct nr_xdp_config* cfg = bpf_map_lookup_elem(&nr_config, &zero);
  if (!cfg || !cfg->port_count) return XDP_PASS;  // not configured yet
  struct ethhdr* eth = data;
  if ((void*)(eth + 1) > end) return XDP_PASS;
  if (!same_mac(eth->h_dest, cfg->mac)) return XDP_PASS;  // broadcast, multicast, flooded
  struct udphdr* udp;
  if (eth->h_proto == bpf_htons(ETH_P_IP)) {
    struct iphdr* ip = (void*)(eth + 1);
    if ((void*)(ip + 1) > end) return XDP_PASS;
    if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP) return XDP_PASS;
    if (ip->frag_off & bpf_htons(0x3FFF)) return XDP_PASS;  // MF or an offset: reassembly
    if ((cfg->flags & NR_XDP_MATCH_IP4) && ip->daddr != cfg->ip4) return XDP_PASS;
    if (!(cfg->flags & NR_XDP_ACCEPT_IP4)) return XDP_PASS;
    udp = (void*)(ip + 1);
  } else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
    struct ipv6hdr* ip6 = (void*)(eth + 1);
    if ((void*)(ip6 + 1) > end) return XDP_PASS;
    if (ip6->version != 6 || ip6->nexthdr != IPPROTO_UDP) return XDP_PASS;
    if (!(cfg->flags & NR_XDP_ACCEPT_IP6)) return XDP_PASS;
    if (cfg->flags & NR_XDP_MATCH_IP6) {
      const __u32* d = ip6->daddr.in6_u.u6_addr32;
      if (d[0] != cfg->ip6[0] || d[1] != cfg->ip6[1] || d[2] != cfg->ip6[2] ||
          d[3] != cfg->ip6[3]) {
        return XDP_PASS;
      }
    }
    udp = (void*)(ip6 + 1);
  } else {
    return XDP_PASS;
  }
  if ((void*)(udp + 1) > end) return XDP_PASS;
  __u32 port = bpf_ntohs(udp->dest);
  if (port < cfg->port_base || port - cfg->port_base >= cfg->port_count) return XDP_PASS;
  if (port - cfg->port_base != ctx->rx_queue_index) {
    return count(NR_XDP_PASSED_OTHER_QUEUE, XDP_PASS);
  }
  if (cfg->max_len && bpf_xdp_get_buff_len(ctx) > cfg->max_len) {
    return count(NR_XDP_PASSED_TOO_LONG, XDP_PASS);
  }
  // No socket at this queue (yet, or any more): the kernel's socket takes it.
  int action = bpf_redirect_map(&nr_xsks, ctx->rx_queue_index, XDP_PASS);
  return count(action == XDP_REDIRECT ? NR_XDP_STEERED : NR_XDP_PASSED_NO_SOCKET, action);
}

char _license[] SEC("license") = "Dual BSD/GPL";
