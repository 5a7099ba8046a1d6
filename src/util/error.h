// Two kinds of failure, kept apart (as Halide does):
//  - UserError: the user's input is wrong (config key, file, shape, CLI flag). The message
//    says what is wrong in the user's terms; the CLI prints it and exits non-zero.
//  - InternalError: an invariant of autosp itself is broken (a bug). The message names it.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace autosp {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

// str("shape ", 3, " vs ", 4): concatenates anything with operator<<.
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void user_error(Args&&... args) {
  throw UserError(str(std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void internal_error(Args&&... args) {
  throw InternalError(str("internal error: ", std::forward<Args>(args)...));
}

}  // namespace autosp

// AUTOSP_CHECK(cond, parts...): an internal invariant; failing it is a bug in autosp.
#define AUTOSP_CHECK(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) ::autosp::internal_error(__FILE__, ":", __LINE__, ": ", #cond, ": ", \
                                          ##__VA_ARGS__);                                \
  } while (0)
