// What the XDP program (xdp_steer.bpf.c) and the transport that loads it
// (xdp_program.cc) share: the layout of its one-entry config map and the indexes of
// its counters. Plain C, included by both the BPF and the C++ compiler.
#pragma once

#include <linux/types.h>

// Queues (hence data threads) one program can steer to: the aggregator's --threads.
#define NR_XDP_MAX_QUEUES 64

// nr_xdp_config.flags
#define NR_XDP_ACCEPT_IP4 0x1  // steer IPv4 datagrams
#define NR_XDP_ACCEPT_IP6 0x2  // steer IPv6 datagrams
#define NR_XDP_MATCH_IP4 0x4   // ... only those to ip4 (the transport is bound to it)
#define NR_XDP_MATCH_IP6 0x8   // ... only those to ip6

struct nr_xdp_config {
  unsigned char mac[6];  // the device's own address: only frames sent to it are steered
  __u16 flags;
  __u32 port_base;   // first UDP data port, host order
  __u32 port_count;  // data ports (= queues served): PORT_BASE .. PORT_BASE + COUNT - 1
  __u32 max_len;     // longest frame a socket takes (0 = any: multi-buffer sockets)
  __u32 ip4;         // network order
  __u32 ip6[4];      // network order
};

enum nr_xdp_counter {
  NR_XDP_STEERED = 0,            // into an AF_XDP socket
  NR_XDP_PASSED_OTHER_QUEUE = 1, // a data port's frame on another port's queue
  NR_XDP_PASSED_TOO_LONG = 2,    // longer than max_len
  NR_XDP_PASSED_NO_SOCKET = 3,   // no socket bound at the queue
  NR_XDP_COUNTERS = 4,
};
