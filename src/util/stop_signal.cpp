#include "util/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace autosp {

namespace {

std::atomic<int> first_signal{0};
std::atomic<bool> announce_first{true};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

void write_stderr(const char* text) {
  ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

extern "C" void on_stop_signal(int signal) {
  int expected = 0;
  if (first_signal.compare_exchange_strong(expected, signal)) {
    if (announce_first.load())
      write_stderr(signal == SIGTERM ? "autosp: SIGTERM received: stopping after this step (again: exit now)\n"
                                   : "autosp: SIGUSR1 received: stopping after this step (again: exit now)\n");
    return;
  }
  write_stderr("autosp: second stop signal: exiting now, without a checkpoint\n");
  ::_exit(128 + signal);
}

}  // namespace

void install_stop_signals(bool announce) {
  announce_first.store(announce);
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // file I/O and MPI's polls carry on; the loop polls the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

int stop_signal() { return first_signal.load(); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a stop signal";
  }
}

}  // namespace autosp
