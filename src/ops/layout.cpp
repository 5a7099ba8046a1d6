// Layout ops: reshape, transpose, slice (and its backward, a zero-padded placement), concat.
// They keep their operand's dtype. reshape and transpose accept any dtype and move bytes,
// so their CPU kernels run on bf16 too; slice and concat take f32 or bf16 (fp32 kernels).
#include <cstring>
#include <vector>

#include "kernels/cpu/basic.h"
#include "ops/op.h"
#ifdef AUTOSP_HAVE_CUDA
#include "ops/cuda_kernels.h"
#endif

namespace autosp {

#ifdef AUTOSP_HAVE_CUDA
namespace {
int64_t esize(const TensorType& t) { return dtype_size(t.dtype); }
// The executors run a reshape as a view; a copy where the result has its own buffer.
void cuda_reshape(const KernelArgs& a, const CudaContext& c) {
  cuda_copy_bytes(a.out<void>(0), a.in<void>(0), a.out_types[0]->bytes(), c, "reshape");
}
void cuda_transpose(const KernelArgs& a, const CudaContext& c) {
  const Shape& x = a.in_shape(0);
  const auto& perm = a.attrs->get_ints("perm");
  cuda::permute(a.in<void>(0), x.data(), perm.data(), static_cast<int>(x.size()), esize(*a.in_types[0]),
                a.out<void>(0), c.stream);
}
void cuda_slice(const KernelArgs& a, const CudaContext& c) {
  const int64_t dim = a.attrs->get_int("dim"), start = a.attrs->get_int("start");
  const Shape& x = a.in_shape(0);
  const Slab s = slab_of(x, dim);
  const int64_t count = a.out_shape(0)[dim];
  cuda::copy_slab(a.in<void>(0), s.outer, x[dim], start, s.inner, count, a.out<void>(0), count, 0,
                  esize(*a.in_types[0]), c.stream);
}
void cuda_slice_backward(const KernelArgs& a, const CudaContext& c) {
  const int64_t dim = a.attrs->get_int("dim"), start = a.attrs->get_int("start");
  const Shape& dy = a.in_shape(0);
  const Slab s = slab_of(dy, dim);
  check_cuda(cudaMemsetAsync(a.out<void>(0), 0, size_t(a.out_types[0]->bytes()), c.stream), "cudaMemsetAsync",
             "slice_backward");
  cuda::copy_slab(a.in<void>(0), s.outer, dy[dim], 0, s.inner, dy[dim], a.out<void>(0), a.out_shape(0)[dim], start,
                  esize(*a.in_types[0]), c.stream);
}
void cuda_concat(const KernelArgs& a, const CudaContext& c) {
  const int64_t dim = a.attrs->get_int("dim");
  const Shape& y = a.out_shape(0);
  const Slab s = slab_of(y, dim);
  int64_t offset = 0;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const int64_t len = a.in_shape(static_cast<int>(i))[dim];
    cuda::copy_slab(a.in<void>(static_cast<int>(i)), s.outer, len, 0, s.inner, len, a.out<void>(0), y[dim], offset,
                    esize(*a.out_types[0]), c.stream);
    offset += len;
  }
}
}  // namespace
#endif

// reshape(x) {shape}: same elements, new shape
extern const OpDef reshape_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require(attrs.has("shape"), "needs a 'shape' attribute");
      Shape shape = attrs.get_ints("shape");
      // Not require(): its message would be built for every reshape.
      for (int64_t d : shape)
        if (d < 0) shape_error("negative dim in ", shape_str(shape));
      if (numel(shape) != numel(in[0].shape))
        shape_error("cannot reshape ", shape_str(in[0].shape), " (", numel(in[0].shape), " elements) to ",
                    shape_str(shape));
      return {{in[0].dtype, shape}};
    },
    .cost = nullptr,
    .grad = [](GradContext& c) {
      c.din[0] = c.b.emit1(OpKind::reshape, {c.dout[0]}, {{"shape", c.b.shape(c.in(0))}});
    },
    .cpu = [](const KernelArgs& a) {
      if (a.out(0) != a.in(0)) std::memcpy(a.out<void>(0), a.in<void>(0), a.out_types[0]->bytes());
    },
    // A sharded dim survives when the dims before it are unchanged as a block and it keeps
    // its size: [B, S, H] <-> [B, S, NH, D] keeps S at dim 1.
    .shard = [](const Shardings& in, const Types& t, const Attrs& attrs) -> Shardings {
      if (!is_shard(in[0])) return {in[0]};
      const Shape& x = t[0].shape;
      const Shape& y = attrs.get_ints("shape");
      const int d = in[0].dim;
      int64_t prefix = 1;
      for (int i = 0; i < d; ++i) prefix *= x[i];
      int64_t p = 1;
      for (size_t j = 0; j < y.size(); ++j) {
        if (p == prefix && y[j] == x[d]) return {shard(static_cast<int>(j))};
        p *= y[j];
      }
      shape_error("reshape ", shape_str(x), " -> ", shape_str(y), " does not keep sharded dim ", d);
    },
    .recompute = Recompute::cheap,
    .cpu_any_dtype = true,  // a view (the executor shares the buffer) or a byte copy
    .cuda = {.name = "reshape", .run = AUTOSP_CUDA_RUN(cuda_reshape)},
};

// transpose(x) {perm}: y's dim i is x's dim perm[i]
extern const OpDef transpose_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require(attrs.has("perm"), "needs a 'perm' attribute");
      const auto& perm = attrs.get_ints("perm");
      const Shape& x = in[0].shape;
      require(perm.size() == x.size() && x.size() <= 8, "perm must list all ", x.size(), " dims (at most 8)");
      std::vector<bool> seen(x.size(), false);
      Shape out;
      for (int64_t p : perm) {
        if (p < 0 || p >= static_cast<int64_t>(x.size()) || seen[p])
          shape_error("perm ", shape_str(perm), " is not a permutation");
        seen[p] = true;
        out.push_back(x[p]);
      }
      return {{in[0].dtype, out}};
    },
    .cost = nullptr,
    // the gradient un-permutes: inverse[perm[i]] = i
    .grad = [](GradContext& c) {
      const auto& perm = c.attrs().get_ints("perm");
      std::vector<int64_t> inverse(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
      c.din[0] = c.b.emit1(OpKind::transpose, {c.dout[0]}, {{"perm", inverse}});
    },
    .cpu = [](const KernelArgs& a) {
      const Shape& x = a.in_shape(0);
      const auto& perm = a.attrs->get_ints("perm");
      cpu::permute(a.in<void>(0), x.data(), perm.data(), static_cast<int>(x.size()),
                   dtype_size(a.in_types[0]->dtype), a.out<void>(0));
    },
    .shard = [](const Shardings& in, const Types&, const Attrs& attrs) -> Shardings {
      if (!is_shard(in[0])) return {in[0]};
      const auto& perm = attrs.get_ints("perm");
      for (size_t i = 0; i < perm.size(); ++i)
        if (perm[i] == in[0].dim) return {shard(static_cast<int>(i))};
      shape_error("bad perm");
    },
    .recompute = Recompute::cheap,
    .cpu_any_dtype = true,  // permutes elements of the dtype's size
    .cuda = {.name = "permute", .run = AUTOSP_CUDA_RUN(cuda_transpose)},
};

// slice(x) {dim, start, end}: x[..., start:end, ...] along dim
extern const OpDef slice_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "x");
      const int64_t dim = dim_attr(attrs, "dim", in[0]);
      require(attrs.has("start") && attrs.has("end"), "needs 'start' and 'end'");
      const int64_t start = attrs.get_int("start"), end = attrs.get_int("end");
      require(0 <= start && start <= end && end <= in[0].shape[dim], "range [", start, ", ", end,
              ") is not within dim ", dim, " of size ", in[0].shape[dim]);
      Shape out = in[0].shape;
      out[dim] = end - start;
      return {{in[0].dtype, out}};
    },
    .cost = nullptr,
    .grad = [](GradContext& c) {
      const int64_t dim = c.attrs().get_int("dim");
      c.din[0] = c.b.emit1(OpKind::slice_backward, {c.dout[0]},
                           {{"dim", dim}, {"start", c.attrs().get_int("start")},
                            {"size", c.b.shape(c.in(0))[dim]}});
    },
    .cpu = [](const KernelArgs& a) {
      const int64_t dim = a.attrs->get_int("dim"), start = a.attrs->get_int("start");
      const Shape& x = a.in_shape(0);
      Slab s = slab_of(x, dim);
      const int64_t count = a.out_shape(0)[dim];
      cpu::copy_slab(a.in(0), s.outer, x[dim], start, s.inner, count, a.out(0), count, 0);
    },
    .shard = [](const Shardings& in, const Types&, const Attrs& attrs) -> Shardings {
      require(!is_partial(in[0]), "cannot slice a partial sum");
      require(!is_shard(in[0]) || in[0].dim != attrs.get_int("dim"), "cannot slice along the sharded dim ",
              in[0].dim);
      return {in[0]};
    },
    .recompute = Recompute::cheap,
    .cuda = {.name = "copy_slab", .run = AUTOSP_CUDA_RUN(cuda_slice)},
};

// slice_backward(dy) {dim, start, size}: dy placed at [start, start + len) of a zero
// tensor whose dim has `size`
extern const OpDef slice_backward_op = {
    .num_inputs = 1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      require_floating(in[0], "dy");
      const int64_t dim = dim_attr(attrs, "dim", in[0]);
      require(attrs.has("start") && attrs.has("size"), "needs 'start' and 'size'");
      const int64_t start = attrs.get_int("start"), size = attrs.get_int("size");
      require(start >= 0 && start + in[0].shape[dim] <= size, "slab of ", in[0].shape[dim],
              " at ", start, " does not fit in ", size);
      Shape out = in[0].shape;
      out[dim] = size;
      return {{in[0].dtype, out}};
    },
    .cost = nullptr,
    .grad = nullptr,
    .cpu = [](const KernelArgs& a) {
      const int64_t dim = a.attrs->get_int("dim"), start = a.attrs->get_int("start");
      const Shape& dy = a.in_shape(0);
      Slab s = slab_of(dy, dim);
      cpu::fill(a.out(0), a.out_numel(0), 0.0f);
      cpu::copy_slab(a.in(0), s.outer, dy[dim], 0, s.inner, dy[dim], a.out(0), a.out_shape(0)[dim],
                     start);
    },
    .cuda = {.name = "slice_backward", .run = AUTOSP_CUDA_RUN(cuda_slice_backward)},
};

// concat(x0, x1, ...) {dim}
extern const OpDef concat_op = {
    .num_inputs = -1,
    .num_outputs = 1,
    .infer = [](const Types& in, const Attrs& attrs) -> Types {
      const int64_t dim = dim_attr(attrs, "dim", in[0]);
      Shape out = in[0].shape;
      out[dim] = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        const TensorType& t = in[i];
        const std::string name = str("operand ", i);
        require_floating(t, name.c_str());
        require_same_dtype(in[0], "operand 0", t, name.c_str());
        Shape a = t.shape, b = in[0].shape;
        require(a.size() == b.size(), "operands must have the same rank");
        a[dim] = b[dim] = 0;
        require(a == b, "operands must agree on every dim but ", dim);
        out[dim] += t.shape[dim];
      }
      return {{in[0].dtype, out}};
    },
    .cost = nullptr,
    // each operand's gradient is its slab of dy
    .grad = [](GradContext& c) {
      const int64_t dim = c.attrs().get_int("dim");
      int64_t start = 0;
      for (size_t i = 0; i < c.node.inputs.size(); ++i) {
        const int64_t len = c.b.shape(c.in(static_cast<int>(i)))[dim];
        if (c.needs[i])
          c.din[i] = c.b.emit1(OpKind::slice, {c.dout[0]},
                               {{"dim", dim}, {"start", start}, {"end", start + len}});
        start += len;
      }
    },
    .cpu = [](const KernelArgs& a) {
      const int64_t dim = a.attrs->get_int("dim");
      const Slab s = slab_of(a.out_shape(0), dim);
      std::vector<const float*> xs;
      std::vector<int64_t> lens;
      for (size_t i = 0; i < a.inputs.size(); ++i) {
        xs.push_back(a.in(static_cast<int>(i)));
        lens.push_back(a.in_shape(static_cast<int>(i))[dim]);
      }
      cpu::concat_slabs(xs.data(), lens.data(), static_cast<int64_t>(xs.size()), s.outer, s.inner, a.out(0));
    },
    .shard = [](const Shardings& in, const Types& t, const Attrs& attrs) -> Shardings {
      Shardings out = shard_elementwise(in, t, attrs);
      require(!is_partial(out[0]), "cannot concatenate partial sums");
      require(!is_shard(out[0]) || out[0].dim != attrs.get_int("dim"), "cannot concatenate along the sharded dim");
      return out;
    },
    .recompute = Recompute::cheap,
    .cuda = {.name = "concat", .run = AUTOSP_CUDA_RUN(cuda_concat)},
};

}  // namespace autosp
