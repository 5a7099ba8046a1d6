#include "util/shared_library.h"

#include <dlfcn.h>

namespace autosp {

void* open_shared_library(const std::string& name, std::string* why) {
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle && why) {
    const char* err = dlerror();
    *why = name + " cannot be loaded (" + (err ? err : "not found") + ")";
  }
  return handle;
}

}  // namespace autosp
