// convert: the one op that changes a floating dtype (f32 <-> bf16).
#include <cstring>

#include "kernels/cpu/basic.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

#ifdef AUTOSP_HAVE_CUDA
namespace {
void cuda_convert(const KernelArgs& a, const CudaContext& c) {
  cuda::convert(cuda_in_dt(a, 0), cuda_out_dt(a, 0), a.in<void>(0), a.in_numel(0), a.out<void>(0), c.stream);
}
}  // namespace
#endif

// convert(x) {dtype}: x's values in dtype ("f32" or "bf16"); to bf16 rounds to nearest,
// ties to even; to f32 is exact; to x's own dtype is a copy.
extern const OpDef convert_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      return {{dtype_attr(attrs, "dtype"), in[0].shape}};
    },
    .cost = [](const Types& in, const Types&, const Attrs&) {
      return Cost{double(numel(in[0].shape)), 0};
    },
    // y = round(x) is treated as the identity (straight through): dx = dy converted back
    // to x's dtype, as torch's .to(dtype) differentiates.
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::convert, {c.dout[0]},
                           {{"dtype", std::string(dtype_name(c.b.type(c.in(0)).dtype))}});
    },
    .cpu = [](const KernelArgs& a) {
      const DType from = a.in_types[0]->dtype, to = a.out_types[0]->dtype;
      const int64_t n = a.in_numel(0);
      if (from == to) {
        if (a.out<void>(0) != a.in<void>(0))
          std::memcpy(a.out<void>(0), a.in<void>(0), a.out_types[0]->bytes());
      } else if (from == DType::f32 && to == DType::bf16) {
        cpu::f32_to_bf16(a.in(0), n, a.out<uint16_t>(0));
      } else if (from == DType::bf16 && to == DType::f32) {
        cpu::bf16_to_f32(a.in<uint16_t>(0), n, a.out(0));
      } else {
        internal_error("convert: no CPU kernel from ", dtype_name(from), " to ", dtype_name(to));
      }
    },
    // Rounding each rank's part of a partial sum is not rounding the sum.
    .shard = [](const Shardings& in, const Types& t, const Attrs& a) -> Shardings {
      require(!is_partial(in[0]), "convert of a partial sum is not a partial sum");
      return shard_elementwise(in, t, a);
    },
    .recompute = Recompute::cheap,
    .cpu_any_dtype = true,
    .cuda = {.name = "convert", .run = AUTOSP_CUDA_RUN(cuda_convert)},
};

}  // namespace autosp
