// Writing a file so that readers see either the old contents or the new, never a mix.
//
// The bytes go to a temporary file in the target's directory (same file system, so the
// rename is atomic), which is fsynced, renamed over the target, and the directory is
// fsynced so the rename itself survives a crash. A process killed at any point leaves
// the target whole, old or new (and at worst a stray hidden temporary `.NAME.tmp.PID.N`). On a
// reported failure the temporary is removed; the target is untouched unless the failure
// came after the rename (fsyncing the directory), when it already holds the new bytes.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace autosp {

// Receives the next piece of the file's contents.
using ByteSink = std::function<void(std::string_view)>;

// Replaces `path` with `bytes`. Throws UserError naming the path and what failed.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Replaces `path` with whatever `produce` passes to its sink, in order, without holding
// the whole file in memory. If `produce` throws, the temporary is removed, the target is
// left as it was, and the exception propagates unchanged.
void write_file_atomic_streaming(const std::string& path,
                                 const std::function<void(const ByteSink&)>& produce);

}  // namespace autosp
