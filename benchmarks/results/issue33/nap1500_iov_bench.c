#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
enum { N = 44, PAY = 1432, HDR = 32, TR = 4, SEG = HDR + PAY + TR };
static uint8_t *tensor; static uint8_t hdr[N][HDR], tr[N][TR], stage[N * SEG];
static double cpu(int sys) { struct rusage r; getrusage(RUSAGE_SELF, &r); struct timeval t = sys ? r.ru_stime : r.ru_utime; return t.tv_sec + t.tv_usec * 1e-6; }
int main() {
  size_t tsz = 64 << 20; tensor = malloc(tsz); memset(tensor, 1, tsz);
  int r = socket(AF_INET, SOCK_DGRAM, 0); struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  bind(r, (void*)&a, sizeof a); socklen_t l = sizeof a; getsockname(r, (void*)&a, &l);
  int sz = 1 << 16; setsockopt(r, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  char cbuf[CMSG_SPACE(2)]; struct iovec iov[3 * N + 1];
  const char *names[] = {"3iov", "join2", "stage1"};
  for (int rep = 0; rep < 4; rep++) for (int mode = 0; mode < 3; mode++) {
    double u0 = cpu(0), s0 = cpu(1); size_t off = 0; int reps = 4000;
    for (int k = 0; k < reps; k++) {
      int n = 0;
      if (mode == 0) for (int i = 0; i < N; i++) { iov[n++] = (struct iovec){hdr[i], HDR}; iov[n++] = (struct iovec){tensor + off + i * PAY, PAY}; iov[n++] = (struct iovec){tr[i], TR}; }
      else if (mode == 1) { static uint8_t j[N][HDR + TR]; iov[n++] = (struct iovec){hdr[0], HDR};
        for (int i = 0; i < N; i++) { iov[n++] = (struct iovec){tensor + off + i * PAY, PAY};
          if (i + 1 < N) { memcpy(j[i], tr[i], TR); memcpy(j[i] + TR, hdr[i + 1], HDR); iov[n++] = (struct iovec){j[i], TR + HDR}; } else iov[n++] = (struct iovec){tr[i], TR}; } }
      else { uint8_t *p = stage; for (int i = 0; i < N; i++) { memcpy(p, hdr[i], HDR); memcpy(p + HDR, tensor + off + i * PAY, PAY); memcpy(p + HDR + PAY, tr[i], TR); p += SEG; } iov[n++] = (struct iovec){stage, N * SEG}; }
      struct msghdr h = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = iov, .msg_iovlen = n, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
      struct cmsghdr *cm = CMSG_FIRSTHDR(&h); cm->cmsg_level = SOL_UDP; cm->cmsg_type = UDP_SEGMENT; cm->cmsg_len = CMSG_LEN(2); *(uint16_t*)CMSG_DATA(cm) = SEG;
      if (sendmsg(s, &h, 0) < 0) { perror("sendmsg"); return 1; }
      off = (off + N * PAY) % (tsz - N * PAY);
    }
    printf("%s user %.2f sys %.2f us/send\n", names[mode], (cpu(0) - u0) / reps * 1e6, (cpu(1) - s0) / reps * 1e6);
  }
}
