// What a UserError says, for tests of bad input.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/error.h"

namespace autosp::testing {

// The message of the E `f` throws; a test failure (and "") when it throws none.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}
template <typename F>
std::string user_error_of(F&& f) {
  return error_of<UserError>(f);
}

// Every part appears in the message.
inline void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

}  // namespace autosp::testing
