// The device-resident bf16 step (train/device_step.h) on the cuda backend.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <utility>

#include "comm/device_collectives.h"
#include "comm/nccl_communicator.h"
#include "io/safetensors.h"
#include "kernels/cuda/kernels.h"
#include "passes/autodiff.h"
#include "passes/plan_memory.h"
#include "runtime/cuda_executor.h"
#include "train/cuda_adamw.h"
#include "train/device_layout.h"
#include "train/device_step.h"
#include "train/trainer.h"
#include "util/error.h"

namespace autosp::train {

static_assert(cuda::kNormBlocks == kDeviceNormPartials, "device_state_bytes counts the norm's partial sums");
static_assert(sizeof(cuda::GradChunk) == 24, "device_state_bytes counts 24 bytes a chunk");

namespace {

const std::string kWhere = "the device-resident training step";

// One cudaMalloc (or, pinned, cudaMallocHost) freed with its owner.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(int64_t bytes, bool pinned_host, const std::string& what) : pinned_(pinned_host) {
    const size_t n = size_t(std::max<int64_t>(bytes, 1));
    if (pinned_) check_cuda(cudaMallocHost(&p_, n), "cudaMallocHost", what);
    else check_cuda(cudaMalloc(&p_, n), "cudaMalloc", what);
  }
  DeviceMemory(DeviceMemory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), pinned_(o.pinned_) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(pinned_, o.pinned_);
    return *this;
  }
  ~DeviceMemory() {
    if (!p_) return;
    if (pinned_) cudaFreeHost(p_);
    else cudaFree(p_);
  }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  bool pinned_ = false;
};

// The graph inputs of a micro batch, in BatchBuffers' order.
const std::array<const char*, 4> kBatchInputs = {"input_ids", "labels", "position_ids", "document_ids"};

class CudaDeviceStep final : public DeviceStep {
 public:
  CudaDeviceStep(const Graph& joint, const std::vector<models::ParameterSpec>& specs, const DeviceConstants& constants,
                 int64_t tokens, bool packed, const ProcessGroups* groups)
      : specs_(specs), tokens_(tokens), batch_inputs_(packed ? 4 : 3) {
    std::vector<int64_t> sizes, constant_sizes;
    for (const auto& spec : specs_) sizes.push_back(autosp::numel(spec.shape));
    for (const auto& spec : constants.specs) constant_sizes.push_back(autosp::numel(spec.shape));
    layout_ = flat_layout(sizes);
    const FlatLayout constant_layout = flat_layout(constant_sizes);
    constant_bytes_ = device_constant_bytes(constant_sizes);

    std::vector<std::string> device_bound(kBatchInputs.begin(), kBatchInputs.begin() + batch_inputs_);
    for (const auto& spec : specs_) device_bound.push_back(spec.name);
    for (const auto& spec : constants.specs) device_bound.push_back(spec.name);
    check_gradients(joint);

    // Everything this step allocates on the device, against what is free, before allocating.
    const int64_t planned = device_state_bytes(sizes) + constant_bytes_ + read_memory_plan(joint).arena_bytes +
                            device_batch_bytes(tokens_, packed);
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo", kWhere);
    if (double(planned) > double(free))
      user_error("the bf16 step on the device needs ", double(planned) / double(1 << 30), " GiB (model state ",
                 double(device_state_bytes(sizes) + constant_bytes_) / double(1 << 30),
                 " GiB at 18 bytes a trained parameter and 2 a frozen one, the step's arena ",
                 double(read_memory_plan(joint).arena_bytes) / double(1 << 30), " GiB), but the GPU has ",
                 double(free) / double(1 << 30), " GiB free of ", double(total) / double(1 << 30),
                 " GiB (a shorter sequence, checkpointing (compile.checkpoint) or a smaller model would need less)");

    ex_ = std::make_unique<CudaExecutor>(joint, groups, nullptr, device_bound);
    if (groups && groups->world->size() > 1) {
      world_ = dynamic_cast<DeviceCollectives*>(ex_->device_groups()->world.get());
      AUTOSP_CHECK(world_, "the executor made no device communicator for the world");
    }
    ex_->set_copy_outputs(false);
    const int64_t n = layout_.total;
    for (DeviceMemory* m : {&master_, &grad_, &exp_avg_, &exp_avg_sq_}) *m = DeviceMemory(4 * n, false, kWhere);
    copy_ = DeviceMemory(2 * n, false, kWhere);
    partials_ = DeviceMemory(8 * kDeviceNormPartials, false, kWhere);
    status_ = DeviceMemory(sizeof(cuda::StepStatus), false, kWhere);
    status_host_ = DeviceMemory(sizeof(cuda::StepStatus), true, kWhere);
    chunks_ = tensor_chunks(sizes, kGradChunkElements);
    chunk_table_ = DeviceMemory(int64_t(sizeof(cuda::GradChunk)) * int64_t(chunks_.size()), false, kWhere);
    chunk_table_host_ = DeviceMemory(int64_t(sizeof(cuda::GradChunk)) * int64_t(chunks_.size()), true, kWhere);
    // Padding stays zero in every buffer (device_layout.h); the gradient sum's padding is
    // read by the norm.
    for (DeviceMemory* m : {&master_, &grad_, &exp_avg_, &exp_avg_sq_})
      check_cuda(cudaMemset(m->as<void>(), 0, size_t(4 * n)), "cudaMemset", kWhere);
    check_cuda(cudaMemset(copy_.as<void>(), 0, size_t(2 * n)), "cudaMemset", kWhere);
    check_cuda(cudaMemset(status_.as<void>(), 0, sizeof(cuda::StepStatus)), "cudaMemset", kWhere);
    // cudaMemset runs on the legacy stream, which the executor's non-blocking streams do not
    // wait for.
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", kWhere);

    check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", kWhere);
    for (int s = 0; s < 2; ++s) {
      batch_device_[s] = DeviceMemory(4 * batch_inputs_ * tokens_, false, kWhere);
      batch_host_[s] = DeviceMemory(4 * batch_inputs_ * tokens_, true, kWhere);
      check_cuda(cudaEventCreateWithFlags(&uploaded_[s], cudaEventDisableTiming), "cudaEventCreate", kWhere);
      check_cuda(cudaEventCreateWithFlags(&consumed_[s], cudaEventDisableTiming), "cudaEventCreate", kWhere);
    }
    for (size_t i = 0; i < specs_.size(); ++i)
      ex_->bind_device(joint_input(specs_[i].name), copy_.as<char>() + 2 * layout_.offset[i]);
    // The constants: rounded to bf16 on the host (to nearest even, as the parameters' copy is),
    // copied once, bound in place.
    AUTOSP_CHECK(constants.values.size() == constants.specs.size(), constants.specs.size(), " constants, ",
                 constants.values.size(), " with values");
    constants_ = DeviceMemory(constant_bytes_, false, kWhere);
    std::vector<uint16_t> rounded;
    for (size_t i = 0; i < constants.specs.size(); ++i) {
      const std::vector<float>& v = constants.values[i];
      AUTOSP_CHECK(int64_t(v.size()) == constant_sizes[i], "constant ", constants.specs[i].name);
      rounded.resize(v.size());
      for (size_t e = 0; e < v.size(); ++e) rounded[e] = io::float_to_bf16(v[e]);
      char* at = constants_.as<char>() + 2 * constant_layout.offset[i];
      check_cuda(cudaMemcpy(at, rounded.data(), 2 * rounded.size(), cudaMemcpyHostToDevice), "cudaMemcpy",
                 str("copying the constant ", constants.specs[i].name, " to the device"));
      ex_->bind_device(joint_input(constants.specs[i].name), at);
    }
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", kWhere);
  }

  ~CudaDeviceStep() override {
    // Destructors cannot throw: failures here are ignored (the error, if any, was reported
    // where it happened).
    if (ex_) cudaStreamSynchronize(ex_->stream());
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (int s = 0; s < 2; ++s) {
      if (uploaded_[s]) cudaEventDestroy(uploaded_[s]);
      if (consumed_[s]) cudaEventDestroy(consumed_[s]);
    }
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  BatchBuffers staging() override {
    // The host slot is free once its last copy to the device has been made (long done,
    // normally: it was enqueued a micro batch ago).
    check_cuda(cudaEventSynchronize(uploaded_[next_]), "cudaEventSynchronize", "the batch's staging slot");
    int32_t* base = batch_host_[next_].as<int32_t>();
    return slot_buffers(base);
  }

  void upload() override {
    // A batch uploaded and not run (a step that failed after staging the next one's first
    // micro batch, or a prefetch the trainer cannot use) is replaced: its slot is left alone.
    const int s = next_;
    // The device slot is free once the step that read it has run past its inputs.
    check_cuda(cudaStreamWaitEvent(copy_stream_, consumed_[s], 0), "cudaStreamWaitEvent", "the batch upload");
    check_cuda(cudaMemcpyAsync(batch_device_[s].as<void>(), batch_host_[s].as<void>(),
                               size_t(4 * batch_inputs_ * tokens_), cudaMemcpyHostToDevice, copy_stream_),
               "cudaMemcpyAsync", "the batch upload");
    check_cuda(cudaEventRecord(uploaded_[s], copy_stream_), "cudaEventRecord", "the batch upload");
    pending_ = s;
    next_ = 1 - s;
  }

  void micro_batch(bool first, float scale) override {
    AUTOSP_CHECK(pending_ >= 0, "micro_batch: no micro batch was uploaded");
    const int s = pending_;
    pending_ = -1;
    cudaStream_t stream = ex_->stream();
    check_cuda(cudaStreamWaitEvent(stream, uploaded_[s], 0), "cudaStreamWaitEvent", kWhere);
    const BatchBuffers b = slot_buffers(batch_device_[s].as<int32_t>());
    const std::array<int32_t*, 4> ptrs = {b.input_ids, b.labels, b.position_ids, b.document_ids};
    for (int i = 0; i < batch_inputs_; ++i) ex_->bind_device(joint_input(kBatchInputs[size_t(i)]), ptrs[size_t(i)]);
    ex_->run_async();
    // The whole step has been enqueued after its reads of the batch, so the slot is free once
    // the stream reaches here.
    check_cuda(cudaEventRecord(consumed_[s], stream), "cudaEventRecord", kWhere);
    upload_chunk_table();  // the first run's; later runs check the outputs stayed where they were
    cuda::accumulate_grad_chunks(cuda::Dt::bf16, chunk_table_.as<cuda::GradChunk>(), int64_t(chunks_.size()), scale,
                                 first, stream);
    cuda::add_loss(static_cast<const float*>(ex_->output_device("loss")), status_.as<cuda::StepStatus>(), first,
                   stream);
    check_cuda(cudaGetLastError(), "the gradient accumulation's launches", kWhere);
  }

  void optimizer(const AdamWParams& params, double lr, int64_t step, double max_norm) override {
    cudaStream_t stream = ex_->stream();
    auto* status = status_.as<cuda::StepStatus>();
    // Every rank's parts of the gradients, summed in fp32 (the padding too: zeros on every rank).
    if (world_) world_->all_reduce_sum_async(grad_.as<float>(), layout_.total, cuda::Dt::f32, stream);
    cuda::grad_norm_partials(grad_.as<float>(), layout_.total, partials_.as<double>(), stream);
    cuda::grad_norm_finish(partials_.as<double>(), max_norm, !world_, ex_->error_flag(), status, stream);
    cuda::adamw_flat(master_.as<float>(), grad_.as<float>(), exp_avg_.as<float>(), exp_avg_sq_.as<float>(),
                     layout_.total, cuda_adamw_scalars(params, step, lr), status, copy_.as<void>(), stream);
    check_cuda(cudaGetLastError(), "the optimizer's launches", kWhere);
    check_cuda(cudaMemcpyAsync(status_host_.as<void>(), status, sizeof(cuda::StepStatus), cudaMemcpyDeviceToHost,
                               stream),
               "cudaMemcpyAsync", "the step's loss and gradient norm");
  }

  DeviceStepResult finish() override {
    check_cuda(cudaStreamSynchronize(ex_->stream()), "cudaStreamSynchronize (the step)", kWhere);
    ex_->check_errors();
    const cuda::StepStatus s = *status_host_.as<cuda::StepStatus>();
    return {s.loss_sum, s.norm, s.applied != 0};
  }

  void load(const ModelState& state) override {
    AUTOSP_CHECK(state.specs.size() == specs_.size(), "a state of ", state.specs.size(), " tensors for ",
                 specs_.size());
    sync();
    std::vector<float> host;
    for (size_t i = 0; i < specs_.size(); ++i) {
      const int64_t n = layout_.numel[i];
      host.resize(size_t(n));
      for (auto [kind, buffer] : {std::pair{StateKind::params, &master_}, std::pair{StateKind::exp_avg, &exp_avg_},
                                  std::pair{StateKind::exp_avg_sq, &exp_avg_sq_}}) {
        state.read(kind, i, 0, n, host.data());
        check_cuda(cudaMemcpy(buffer->as<float>() + layout_.offset[i], host.data(), size_t(4 * n),
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy", str("loading ", specs_[i].name, " onto the device"));
      }
    }
    // A pageable cudaMemcpy may return before its DMA is done, and the executor's stream does
    // not wait for the legacy stream's copies: the whole device first.
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", kWhere);
    cuda::convert(cuda::Dt::f32, cuda::Dt::bf16, master_.as<void>(), layout_.total, copy_.as<void>(), ex_->stream());
    check_cuda(cudaGetLastError(), "the bf16 copy's launch", kWhere);
    sync();
  }

  void download(ModelState& state, bool moments) override {
    sync();
    auto fetch = [&](const DeviceMemory& buffer, std::vector<std::vector<float>>& out) {
      out.resize(specs_.size());
      for (size_t i = 0; i < specs_.size(); ++i) {
        out[i].resize(size_t(layout_.numel[i]));
        check_cuda(cudaMemcpy(out[i].data(), buffer.as<float>() + layout_.offset[i], size_t(4 * layout_.numel[i]),
                              cudaMemcpyDeviceToHost),
                   "cudaMemcpy", str("reading ", specs_[i].name, " from the device"));
      }
    };
    fetch(master_, state.params);
    if (moments) {
      fetch(exp_avg_, state.exp_avg);
      fetch(exp_avg_sq_, state.exp_avg_sq);
    }
  }

  int64_t state_bytes() const override { return device_state_bytes(layout_.numel) + constant_bytes_; }
  int64_t arena_bytes() const override {
    return ex_->arena_bytes() + ex_->input_bytes() + device_batch_bytes(tokens_, batch_inputs_ == 4);
  }

 private:
  void sync() {
    check_cuda(cudaStreamSynchronize(ex_->stream()), "cudaStreamSynchronize", kWhere);
    check_cuda(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize", kWhere);
  }

  ValueId joint_input(const std::string& name) const { return ex_->graph().find_input(name); }

  BatchBuffers slot_buffers(int32_t* base) const {
    BatchBuffers b;
    b.input_ids = base;
    b.labels = base + tokens_;
    b.position_ids = base + 2 * tokens_;
    b.document_ids = batch_inputs_ == 4 ? base + 3 * tokens_ : nullptr;
    return b;
  }

  // The step's gradient outputs: "grad:<name>" of every parameter, of the compute dtype.
  void check_gradients(const Graph& joint) const {
    for (const auto& spec : specs_) {
      const ValueId g = joint.output(kGradPrefix + spec.name);
      AUTOSP_CHECK(joint.type(g) == (TensorType{DType::bf16, spec.shape}), "the step's gradient of ", spec.name,
                   " is not bf16 of its shape");
    }
  }

  // The accumulation's chunks point into the step's outputs, which live at planned offsets of
  // the arena: known once the first run has been enqueued, and the same for every run after.
  void upload_chunk_table() {
    std::vector<const char*> sources(specs_.size());
    for (size_t i = 0; i < specs_.size(); ++i)
      sources[i] = static_cast<const char*>(ex_->output_device(kGradPrefix + specs_[i].name));
    if (chunk_table_ready_) {
      AUTOSP_CHECK(sources == grad_sources_, "the step's gradient outputs moved between runs (the plan's offsets "
                   "are fixed)");
      return;
    }
    grad_sources_ = sources;
    auto* table = chunk_table_host_.as<cuda::GradChunk>();
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const TensorChunk& t = chunks_[c];
      table[c] = {sources[size_t(t.tensor)] + 2 * t.begin, grad_.as<float>() + layout_.offset[size_t(t.tensor)] + t.begin,
                  t.n};
    }
    check_cuda(cudaMemcpyAsync(chunk_table_.as<void>(), table, sizeof(cuda::GradChunk) * chunks_.size(),
                               cudaMemcpyHostToDevice, ex_->stream()),
               "cudaMemcpyAsync", "the gradient accumulation's table");
    chunk_table_ready_ = true;
  }

  std::vector<models::ParameterSpec> specs_;
  int64_t tokens_;
  int batch_inputs_;
  FlatLayout layout_;
  std::unique_ptr<CudaExecutor> ex_;
  DeviceCollectives* world_ = nullptr;  // the executor's world group, with more than one rank
  DeviceMemory master_, grad_, exp_avg_, exp_avg_sq_, copy_, partials_, status_, status_host_;
  DeviceMemory constants_;  // the model's constants, bf16, in their own flat layout
  int64_t constant_bytes_ = 0;
  std::vector<TensorChunk> chunks_;
  std::vector<const char*> grad_sources_;  // per parameter: its gradient output, as the first run placed it
  DeviceMemory chunk_table_, chunk_table_host_;
  bool chunk_table_ready_ = false;
  cudaStream_t copy_stream_ = nullptr;
  std::array<DeviceMemory, 2> batch_device_, batch_host_;
  std::array<cudaEvent_t, 2> uploaded_{}, consumed_{};
  int next_ = 0;      // the slot staging() and upload() use next
  int pending_ = -1;  // the slot uploaded and not yet run
};

}  // namespace

std::unique_ptr<DeviceStep> make_device_step(const Graph& joint, const std::vector<models::ParameterSpec>& specs,
                                             const DeviceConstants& constants, int64_t tokens, bool packed,
                                             const ProcessGroups* groups) {
  std::string why;
  if (cuda_device_count(&why) == 0)
    user_error("backend cuda: no CUDA device is usable here (", why,
               "); run on a machine with an NVIDIA GPU and its driver, or use --backend cpu");
  select_local_device();  // this rank's GPU, before the free-memory check looks at it
  return std::make_unique<CudaDeviceStep>(joint, specs, constants, tokens, packed, groups);
}

}  // namespace autosp::train
