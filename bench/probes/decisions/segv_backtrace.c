// SPDX-License-Identifier: Apache-2.0
// LD_PRELOAD helper: on SIGSEGV / SIGBUS, prints the native backtrace (module + offset per frame,
// for addr2line) to stderr and exits 128 + signal. Python's faulthandler shows only Python frames.
//   gcc -shared -fPIC -O1 -o libsegv.so segv_backtrace.c; LD_PRELOAD=./libsegv.so python3 ...
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>
#include <string.h>
#include <stdio.h>
static void on_segv(int sig, siginfo_t* si, void* ctx) {
  (void)ctx;
  char msg[96];
  int n = snprintf(msg, sizeof msg, "\n*** signal %d, fault address %p; backtrace:\n", sig, si->si_addr);
  write(2, msg, n);
  void* buf[80];
  int k = backtrace(buf, 80);
  backtrace_symbols_fd(buf, k, 2);
  _exit(128 + sig);
}
__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  static char stack[1 << 16];
  stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
  sigaltstack(&ss, 0);
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
