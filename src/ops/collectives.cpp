// Collectives as ops: each names its group ("sp", "dp" or "world") and the group's size,
// so its shape rule is static. Their gradients are collectives again. They move f32 or bf16
// values and keep the dtype (a bf16 all-to-all moves half the bytes; its cost says so).
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/basic.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "comm/nccl_communicator.h"
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

namespace {

void check_group(const Attrs& attrs) {
  require(attrs.has("group"), "needs a 'group' attribute (sp, dp or world)");
  const std::string& g = attrs.get_str("group");
  require(g == "sp" || g == "dp" || g == "world", "unknown group '", g, "'");
  require(attrs.has("size") && attrs.get_int("size") >= 1, "needs the group's 'size' (>= 1)");
}

}  // namespace

namespace {

// Device scratch: the blocks to send and those received.
int64_t cuda_all_to_all_workspace(const Types& in, const Types&, const Attrs&) { return 2 * in[0].bytes(); }
// Gathering along a dim with dims before it: the blocks arrive in rank order, then move.
int64_t cuda_all_gather_workspace(const Types& in, const Types&, const Attrs& attrs) {
  return slab_of(in[0].shape, dim_attr(attrs, "dim", in[0])).outer == 1 ? 0 : in[0].bytes() * attrs.get_int("size");
}
int64_t cuda_reduce_scatter_workspace(const Types& in, const Types&, const Attrs& attrs) {
  return slab_of(in[0].shape, dim_attr(attrs, "dim", in[0])).outer == 1 ? 0 : in[0].bytes();
}

// all_to_all on the CPU: x's blocks packed into the workspace's send half and the exchange
// started; its finish waits for it and unpacks the received half into the result.
StartedKernel cpu_all_to_all_start(const KernelArgs& a) {
  const int64_t P = a.attrs->get_int("size");
  const int64_t s = a.attrs->get_int("scatter_dim"), g = a.attrs->get_int("gather_dim");
  const int64_t chunk = a.in_numel(0) / P;
  float* send = static_cast<float*>(a.workspace);
  float* recv = send + a.in_numel(0);
  const Slab xs = slab_of(a.in_shape(0), s);
  const int64_t c = xs.len / P;
  for (int64_t p = 0; p < P; ++p)
    cpu::copy_slab(a.in(0), xs.outer, xs.len, p * c, xs.inner, c, send + p * chunk, c, 0);
  std::shared_ptr<PendingCollective> pending = a.comm->all_to_all_start(send, recv, chunk);
  // A received block has x's shape with the scatter dim cut to c; it fills slab p of the
  // gather dim.
  Shape block = a.in_shape(0);
  block[s] = c;
  const Slab bs = slab_of(block, g);
  float* out = a.out(0);
  return {[pending] { return pending->test(); },
          [pending, recv, chunk, bs, P, out] {
            pending->wait();
            for (int64_t p = 0; p < P; ++p)
              cpu::copy_slab(recv + p * chunk, bs.outer, bs.len, 0, bs.inner, bs.len, out, bs.len * P, p * bs.len);
          }};
}

#ifdef AUTOSP_HAVE_CUDA
// As the CPU kernels, with device copies and NCCL calls enqueued on the executor's stream.
int64_t esize(const TensorType& t) { return dtype_size(t.dtype); }
// all_to_all in two parts (CudaKernelRules::pack, exchange): x's blocks packed into the
// workspace's send half; then the exchange into its received half, unpacked into the result.
void cuda_all_to_all_pack(const KernelArgs& a, const CudaContext& c) {
  const int64_t P = a.attrs->get_int("size"), s = a.attrs->get_int("scatter_dim");
  const int64_t es = esize(*a.in_types[0]), chunk = a.in_types[0]->bytes() / P;
  char* send = static_cast<char*>(a.workspace);
  const Slab xs = slab_of(a.in_shape(0), s);
  const int64_t cnt = xs.len / P;
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(a.in<void>(0), xs.outer, xs.len, p * cnt, xs.inner, cnt, send + p * chunk, cnt, 0, es, c.stream);
}
void cuda_all_to_all_exchange(const KernelArgs& a, const CudaContext& c) {
  DeviceCollectives& comm = cuda_collectives(a, "all_to_all");
  const int64_t P = a.attrs->get_int("size"), s = a.attrs->get_int("scatter_dim"), g = a.attrs->get_int("gather_dim");
  const int64_t es = esize(*a.in_types[0]), bytes = a.in_types[0]->bytes(), chunk = bytes / P;
  char* send = static_cast<char*>(a.workspace);
  char* recv = send + bytes;
  comm.all_to_all_async(send, recv, chunk, c.stream);
  // A received block has x's shape with the scatter dim cut to cnt; it fills slab p of the
  // gather dim.
  Shape block = a.in_shape(0);
  block[s] /= P;
  const Slab bs = slab_of(block, g);
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(recv + p * chunk, bs.outer, bs.len, 0, bs.inner, bs.len, a.out<void>(0), bs.len * P, p * bs.len,
                    es, c.stream);
}
void cuda_all_to_all(const KernelArgs& a, const CudaContext& c) {
  cuda_all_to_all_pack(a, c);
  cuda_all_to_all_exchange(a, c);
}
void cuda_all_reduce(const KernelArgs& a, const CudaContext& c) {
  DeviceCollectives& comm = cuda_collectives(a, "all_reduce");
  cuda_copy_bytes(a.out<void>(0), a.in<void>(0), a.out_types[0]->bytes(), c, "all_reduce");
  comm.all_reduce_sum_async(a.out<void>(0), a.out_numel(0), cuda_out_dt(a, 0), c.stream);
}
void cuda_all_gather(const KernelArgs& a, const CudaContext& c) {
  DeviceCollectives& comm = cuda_collectives(a, "all_gather");
  const int64_t P = a.attrs->get_int("size"), d = a.attrs->get_int("dim"), es = esize(*a.in_types[0]);
  const Slab xs = slab_of(a.in_shape(0), d);
  if (xs.outer == 1) {  // rank p's block is where the rank order puts it
    comm.all_gather_async(a.in<void>(0), a.out<void>(0), a.in_types[0]->bytes(), c.stream);
    return;
  }
  char* recv = static_cast<char*>(a.workspace);
  comm.all_gather_async(a.in<void>(0), recv, a.in_types[0]->bytes(), c.stream);
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(recv + p * a.in_types[0]->bytes(), xs.outer, xs.len, 0, xs.inner, xs.len, a.out<void>(0),
                    xs.len * P, p * xs.len, es, c.stream);
}
void cuda_reduce_scatter(const KernelArgs& a, const CudaContext& c) {
  DeviceCollectives& comm = cuda_collectives(a, "reduce_scatter");
  const int64_t P = a.attrs->get_int("size"), d = a.attrs->get_int("dim"), es = esize(*a.in_types[0]);
  const Slab xs = slab_of(a.in_shape(0), d);
  const int64_t cnt = xs.len / P, chunk = a.out_numel(0);
  if (xs.outer == 1) {
    comm.reduce_scatter_sum_async(a.in<void>(0), a.out<void>(0), chunk, cuda_in_dt(a, 0), c.stream);
    return;
  }
  char* send = static_cast<char*>(a.workspace);
  for (int64_t p = 0; p < P; ++p)
    cuda::copy_slab(a.in<void>(0), xs.outer, xs.len, p * cnt, xs.inner, cnt, send + p * chunk * es, cnt, 0, es,
                    c.stream);
  comm.reduce_scatter_sum_async(send, a.out<void>(0), chunk, cuda_in_dt(a, 0), c.stream);
}
#endif

}  // namespace

// all_to_all(x) {group, size, scatter_dim, gather_dim}: x's scatter dim is cut into `size`
// blocks, block p goes to rank p; the blocks received are stacked along the gather dim in
// rank order. Ulysses: [B, S/P, NH, D] -> [B, S, NH/P, D] with scatter 2, gather 1.
extern const OpDef all_to_all_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_group(attrs);
      require_floating(in[0], "x");
      const int64_t P = attrs.get_int("size"), s = dim_attr(attrs, "scatter_dim", in[0]),
                    g = dim_attr(attrs, "gather_dim", in[0]);
      require(s != g, "scatter_dim and gather_dim must differ");
      require(in[0].shape[s] % P == 0, "scatter dim ", s, " (", in[0].shape[s], ") is not divisible by ", P);
      Shape out = in[0].shape;
      out[s] /= P;
      out[g] *= P;
      return {{in[0].dtype, out}};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      const double P = double(attrs.get_int("size"));
      return Cost{0, double(in[0].bytes()) * (P - 1) / P};
    },
    // the inverse exchange
    .grad = [](GradContext& c) {
      Attrs a = c.attrs();
      a.set("scatter_dim", c.attrs().get_int("gather_dim"));
      a.set("gather_dim", c.attrs().get_int("scatter_dim"));
      c.din[0] = c.b.emit1(OpKind::all_to_all, {c.dout[0]}, a);
    },
    .cpu = [](const KernelArgs& a) { cpu_all_to_all_start(a).finish(); },
    .cpu_workspace_bytes = [](const Types& in, const Attrs&, int) -> int64_t { return 2 * in[0].bytes(); },
    .cuda = {.name = "nccl_all_to_all",
             .run = AUTOSP_CUDA_RUN(cuda_all_to_all),
             .workspace_bytes = cuda_all_to_all_workspace,
             .overlappable = true,
             .pack = AUTOSP_CUDA_RUN(cuda_all_to_all_pack),
             .exchange = AUTOSP_CUDA_RUN(cuda_all_to_all_exchange)},
    .cpu_start = cpu_all_to_all_start,
};

// all_reduce(x) {group, size}: the sum over the group, on every rank.
extern const OpDef all_reduce_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_group(attrs);
      require_floating(in[0], "x");
      return {in[0]};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      const double P = double(attrs.get_int("size"));
      return Cost{double(numel(in[0].shape)), 2 * double(in[0].bytes()) * (P - 1) / P};
    },
    // y = sum_r x_r feeds every rank's part of the loss: dx = sum_r dy_r
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::all_reduce, {c.dout[0]}, c.attrs()); },
    .cpu = [](const KernelArgs& a) {
      if (a.out(0) != a.in(0)) std::copy(a.in(0), a.in(0) + a.in_numel(0), a.out(0));
      a.comm->all_reduce_sum(a.out(0), a.out_numel(0));
    },
    .cpu_inplace = true,
    .cuda = {.name = "nccl_all_reduce", .run = AUTOSP_CUDA_RUN(cuda_all_reduce), .inplace = true},
};

// all_gather(x) {group, size, dim}: the group's x stacked along dim in rank order.
extern const OpDef all_gather_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_group(attrs);
      // i32 too: the autosp pass gathers packed samples' document ids (bytes are bytes).
      if (in[0].dtype != DType::i32) require_floating(in[0], "x");
      Shape out = in[0].shape;
      out[dim_attr(attrs, "dim", in[0])] *= attrs.get_int("size");
      return {{in[0].dtype, out}};
    },
    .cost = [](const Types&, const Types& out, const Attrs& attrs) {
      const double P = double(attrs.get_int("size"));
      return Cost{0, double(out[0].bytes()) * (P - 1) / P};
    },
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::reduce_scatter, {c.dout[0]}, c.attrs()); },
    .cpu = [](const KernelArgs& a) {
      const int64_t P = a.attrs->get_int("size"), d = a.attrs->get_int("dim");
      const Slab xs = slab_of(a.in_shape(0), d);
      // Gathered along the outermost dim (ZeRO-3's flat parameter groups), rank p's block
      // is where the rank order puts it: gather straight into the result.
      if (xs.outer == 1) {
        a.comm->all_gather(a.in(0), a.out(0), a.in_numel(0));
        return;
      }
      float* recv = static_cast<float*>(a.workspace);
      a.comm->all_gather(a.in(0), recv, a.in_numel(0));
      for (int64_t p = 0; p < P; ++p)
        cpu::copy_slab(recv + p * a.in_numel(0), xs.outer, xs.len, 0, xs.inner, xs.len, a.out(0), xs.len * P,
                       p * xs.len);
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      if (slab_of(in[0].shape, dim_attr(attrs, "dim", in[0])).outer == 1) return 0;
      return in[0].bytes() * attrs.get_int("size");
    },
    .cuda = {.name = "nccl_all_gather",
             .run = AUTOSP_CUDA_RUN(cuda_all_gather),
             .workspace_bytes = cuda_all_gather_workspace},
};

// reduce_scatter(x) {group, size, dim}: the sum over the group, cut along dim; rank r keeps
// block r.
extern const OpDef reduce_scatter_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      check_group(attrs);
      require_floating(in[0], "x");
      const int64_t d = dim_attr(attrs, "dim", in[0]), P = attrs.get_int("size");
      require(in[0].shape[d] % P == 0, "dim ", d, " (", in[0].shape[d], ") is not divisible by ", P);
      Shape out = in[0].shape;
      out[d] /= P;
      return {{in[0].dtype, out}};
    },
    .cost = [](const Types& in, const Types&, const Attrs& attrs) {
      const double P = double(attrs.get_int("size"));
      return Cost{double(numel(in[0].shape)), double(in[0].bytes()) * (P - 1) / P};
    },
    .grad = [](GradContext& c) { c.din[0] = c.b.emit1(OpKind::all_gather, {c.dout[0]}, c.attrs()); },
    .cpu = [](const KernelArgs& a) {
      const int64_t P = a.attrs->get_int("size"), d = a.attrs->get_int("dim");
      const Slab xs = slab_of(a.in_shape(0), d);
      const int64_t c = xs.len / P, chunk = a.out_numel(0);
      // Cut along the outermost dim (grad_sync's flat buckets), rank p's block is already
      // contiguous: reduce straight from the operand.
      if (xs.outer == 1) {
        a.comm->reduce_scatter_sum(a.in(0), a.out(0), chunk);
        return;
      }
      float* send = static_cast<float*>(a.workspace);
      for (int64_t p = 0; p < P; ++p)
        cpu::copy_slab(a.in(0), xs.outer, xs.len, p * c, xs.inner, c, send + p * chunk, c, 0);
      a.comm->reduce_scatter_sum(send, a.out(0), chunk);
    },
    .cpu_workspace_bytes = [](const Types& in, const Attrs& attrs, int) -> int64_t {
      return slab_of(in[0].shape, dim_attr(attrs, "dim", in[0])).outer == 1 ? 0 : in[0].bytes();
    },
    .cuda = {.name = "nccl_reduce_scatter",
             .run = AUTOSP_CUDA_RUN(cuda_reduce_scatter),
             .workspace_bytes = cuda_reduce_scatter_workspace},
};

}  // namespace autosp
