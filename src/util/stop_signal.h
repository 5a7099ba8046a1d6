// Preemption: SIGTERM and SIGUSR1 (what SLURM, Kubernetes and Open MPI's mpirun send before
// they kill a job) ask the training loop to stop at the next step boundary, save and exit.
//
// The handler only records the signal (async-signal-safe); the loop polls stop_signal()
// after each step and the ranks agree on it with a collective, so every rank stops after
// the same step. A second such signal, the user insisting, ends the process at once with
// 128 + the signal's number, without a checkpoint.
#pragma once

namespace autosp {

// Installs the handler for SIGTERM and SIGUSR1. Idempotent. `announce`: say on stderr when
// the first signal arrives (one rank of a job does).
void install_stop_signals(bool announce);

// The first stop signal received (SIGTERM or SIGUSR1), or 0 if none.
int stop_signal();

// "SIGTERM", "SIGUSR1", or "signal N".
const char* signal_name(int signal);

}  // namespace autosp
