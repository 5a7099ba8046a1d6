// A process running in the background (the CLI, or mpirun and its ranks) that a test can
// signal while it runs: the ranks' pids, SIGTERM/SIGSTOP/SIGKILL, and a wait with a deadline.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace autosp::testing {

class Background {
 public:
  // Runs `command` with /bin/sh (exec'd, so pid() is the command itself), its stdout and
  // stderr in `log`.
  Background(const std::string& command, const std::string& log) : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string line = "exec " + command + " >" + log + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (running()) {
      kill_tree(SIGKILL);
      wait_for(10);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && exit_code_ < 0; }

  // The processes whose parent is pid() (mpirun's ranks), by /proc; named `name` if given.
  std::vector<pid_t> children(const std::string& name = "") const {
    std::vector<pid_t> out;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string id = entry.path().filename().string();
      if (id.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "stat");
      std::string stat;
      std::getline(in, stat);
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      const std::string comm = stat.substr(stat.find('(') + 1, close - stat.find('(') - 1);
      char state = 0;
      int ppid = 0;
      if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2) continue;
      if (ppid == pid_ && (name.empty() || comm == name)) out.push_back(std::stoi(id));
    }
    return out;
  }

  void signal(int sig) const { ::kill(pid_, sig); }
  void kill_tree(int sig) const {
    for (pid_t child : children()) ::kill(child, sig);
    ::kill(pid_, sig);
  }

  // Waits up to `seconds` for the process to end; its exit code (128 + signal if one ended
  // it), or -1 if it is still running.
  int wait_for(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (exit_code_ < 0) {
      int status = 0;
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return exit_code_;
  }

  std::string output() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
};

// Lines in a file (0 if it does not exist): a metrics file's steps so far.
inline int count_lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.empty() ? 0 : 1;
  return n;
}

// Waits until `path` has at least `lines` lines or `background` ended; false on timeout.
inline bool wait_for_lines(const std::string& path, int lines, Background& background, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (count_lines(path) < lines) {
    if (background.wait_for(0) >= 0 || std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace autosp::testing
