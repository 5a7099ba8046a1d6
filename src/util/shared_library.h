// Opening a shared library at run time (dlopen), for the CUDA libraries autosp does not link
// (runtime/cuda_blas.h: cuBLAS; ops/cuda_attention_cudnn.cpp: cuDNN and NVRTC).
#pragma once
#include <string>

namespace autosp {

// dlopen(name, RTLD_NOW | RTLD_LOCAL): the handle, kept for the process's life as a linked
// library's would be; or null with *why set to "<name> cannot be loaded (<the loader's reason>)".
void* open_shared_library(const std::string& name, std::string* why);

}  // namespace autosp
