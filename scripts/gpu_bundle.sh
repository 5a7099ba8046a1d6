#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs onto a GPU machine that has CUDA and PyTorch but not
# autosp's build dependencies (OpenBLAS, Open MPI, ...): the binaries of a cuda build made
# here, and the shared libraries they load that are not CUDA's (the GPU machine brings the
# driver, cuBLAS, NCCL, cuDNN and NVRTC) nor the C library's.
#
#   scripts/gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]     (defaults: build, .gpu-bundle)
#
# It writes BUNDLE_DIR and BUNDLE_DIR.tar.xz, the one to carry (a device run's working tree and
# what it carries are 64 MiB at most, together: the directory alone is near that). Then, on the
# GPU machine: scripts/gpu_check.sh --bundle .gpu-bundle.tar.xz
# (.gitignore lists both, so they travel only when carried.)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bundle=${2:-.gpu-bundle}
cmake --build "$build" -j 2 --target autosp cuda_ops_test bench_cuda
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for b in autosp cuda_ops_test bench_cuda; do
  cp "$build/$b" "$bundle/bin/"
  strip --strip-unneeded "$bundle/bin/$b"  # symbols would double the bundle
done
# bundle_libs FILE...: the shared libraries they load into $bundle/lib, but the C library's and
# what the GPU machine brings: the driver, cuBLAS, NCCL, and cuDNN (its 100 MB engine
# libraries, loaded by libcudnn at run time, are not even listed by ldd) and NVRTC (100 MB),
# which would not fit a device run's carry either.
bundle_libs() {
  for f in "$@"; do
    ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*|libnccl.so*|libnvidia*|libcudnn*|libnvrtc*) ;;
      *) [ -e "$bundle/lib/$(basename "$lib")" ] || cp -L "$lib" "$bundle/lib/" ;;
    esac
  done
}
bundle_libs "$bundle"/bin/*
# Open MPI, for gpu_check's sp_one_gpu stage (several ranks on the one GPU) where the GPU
# machine has none: mpirun and its daemon, the plugins (Open MPI's and PMIx's) and help files
# in the layout of Debian's prefix (/usr), relocated by OPAL_PREFIX=<bundle>/ompi (gpu_check.sh
# sets it), and the libraries they load beside the binaries' in lib/.
if command -v orterun > /dev/null; then
  ompi="$bundle/ompi"
  arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
  mkdir -p "$ompi/bin" "$ompi/lib/$arch" "$ompi/share"
  cp -L "$(command -v orterun)" "$ompi/bin/mpirun"
  cp -L "$(command -v orted)" "$ompi/bin/orted"
  for d in openmpi pmix2; do
    [ -d "/usr/lib/$arch/$d" ] && cp -rL "/usr/lib/$arch/$d" "$ompi/lib/$arch/"
  done
  rm -rf "$ompi/lib/$arch/openmpi/include"
  cp -r /usr/share/openmpi "$ompi/share/"
  [ -d /usr/share/pmix ] && cp -r /usr/share/pmix "$ompi/share/"
  mapfile -t ompi_files < <(find "$ompi" -name '*.so*' -o -path "$ompi/bin/*")
  bundle_libs "${ompi_files[@]}"
fi
# (.gitignore lists .gpu-bundle and .gpu-bundle.tar.xz: they travel to a GPU machine only when carried.)
du -sh "$bundle"
tar -C "$bundle" -cf - . | xz -T2 -6 > "$bundle.tar.xz"
# A device run's working tree (the tracked files and the untracked ones git does not ignore) and
# what it carries are at most 64 MiB together (.library/device/README.md): checked here, with 4
# MiB to spare, so that a lent GPU's time is not lost to a refused call.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | awk 'END {print $1}')
packed=$(stat -c %s "$bundle.tar.xz")
echo "gpu_bundle: $bundle.tar.xz is $((packed / 1024)) KiB; with the working tree ($((tree / 1024)) KiB)" \
     "$(( (tree + packed) / 1024 )) KiB of the 65536 a device run takes"
if [ $((tree + packed)) -gt $((60 * 1024 * 1024)) ]; then
  echo "gpu_bundle: the working tree and $bundle.tar.xz exceed 60 MiB: a device run would refuse them" >&2
  exit 1
fi
