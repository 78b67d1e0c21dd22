// How long a multi-threaded process's other threads run after kill(pid, SIGSTOP) returns.
// The child: a main thread asleep (as the daemon's Python main thread waits) and a worker
// that counts in shared memory (as its data-plane thread answers packets). The parent
// sends SIGSTOP, then reads the count at once and until every thread is in state T.
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long *count;
static void *work(void *a) { (void)a; for (;;) (*count)++; return 0; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int all_stopped(pid_t pid) {
  char path[64]; snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path); struct dirent *e; int n = 0, t = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[128], buf[512]; snprintf(p, sizeof p, "/proc/%d/task/%s/stat", pid, e->d_name);
    FILE *f = fopen(p, "r"); if (!f) continue;
    if (fgets(buf, sizeof buf, f)) { char *c = strrchr(buf, ')'); n++; if (c && c[2] == 'T') t++; }
    fclose(f);
  }
  closedir(d); return n > 0 && t == n;
}
int main(int argc, char **argv) {
  int trials = argc > 1 ? atoi(argv[1]) : 20;
  count = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pid_t pid = fork();
  if (pid == 0) { pthread_t t; pthread_create(&t, 0, work, 0); for (;;) pause(); }
  usleep(200000);
  int ran = 0; double worst = 0;
  for (int i = 0; i < trials; i++) {
    usleep(20000);  // the main thread asleep in pause(), the worker counting
    double t0 = now();
    kill(pid, SIGSTOP);
    unsigned long c0 = *count;
    while (!all_stopped(pid)) ;
    double t1 = now();
    unsigned long c1 = *count;
    usleep(20000);
    unsigned long c2 = *count;
    if (c1 != c0) ran++;
    if (t1 - t0 > worst) worst = t1 - t0;
    printf("trial %2d: worker counted %10lu after kill() returned; all threads T after %7.3f ms; then %lu\n",
           i, c1 - c0, (t1 - t0) * 1e3, c2 - c1);
    kill(pid, SIGCONT);
  }
  printf("worker ran on after kill(SIGSTOP) in %d of %d trials; longest until all T: %.3f ms\n", ran, trials, worst * 1e3);
  kill(pid, SIGKILL); waitpid(pid, 0, 0);
  return 0;
}
