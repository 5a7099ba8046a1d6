// The cuda backend's bf16 training step with the model state resident on the device
// (DESIGN.md "Numbers and types": bf16 compute, fp32 master weights and optimizer state on
// the GPU), which `autosp train --backend cuda` runs when the config enables bf16.
//
// On the device, in flat buffers of one layout (train/device_layout.h): fp32 master weights,
// the fp32 sum of a step's gradients, AdamW's two fp32 moments, and the bf16 copy of the
// weights the compiled step reads (bound in place: no parameter is copied per step). 18 bytes
// per parameter, plus the step's arena.
//
// A step, all of it enqueued on the executor's stream:
//   per micro batch: the compiled bf16 step (forward + backward); its bf16 gradients added
//     into the fp32 sums, scaled by 1/g, in one multi-tensor launch; its loss added into a
//     device double;
//   then: the global gradient norm (a deterministic two-launch reduction), clip_grad_norm's
//     coefficient, and AdamW over all parameters in one launch, which also rewrites the bf16
//     copy. Neither the norm nor the coefficient goes through the host. A non-finite loss or
//     norm skips the update on the device, so a diverged step changes nothing.
// finish() is the step's one host synchronisation: it reads the loss sum, the norm and
// whether the update was applied (copied to pinned memory at the end of the step), and the
// kernels' data-error flag.
//
// The batch: the trainer writes each micro batch into pinned host memory (staging()), and
// upload() copies it to the device on a copy stream of its own, so the copy of the next micro
// batch (and the trainer's reading of it from disk) overlaps the step running on the device.
// Two slots alternate; the copy into a slot waits (on the device) for the step that read it.
//
// Several ranks (sequence and data parallel, ZeRO stage 0: every rank holds the whole state):
// the compiled step's collectives and the gradients' reduction run on the executor's device
// groups (NCCL, or staged over MPI where ranks share a GPU: comm/nccl_communicator.h,
// make_device_groups). After the last micro batch the fp32 gradient sums are summed over the
// world in one all-reduce (fp32: no bf16 rounding in the reduction), before the norm.
//
// Host code only here (no CUDA types): the trainer, built with or without the cuda backend,
// holds one through this interface; make_device_step is cuda_device_step.cpp's.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "ir/graph.h"
#include "models/llama.h"
#include "train/adamw.h"

namespace autosp::train {

struct ModelState;

// One micro batch of B x S tokens (this rank's slice), where the trainer writes it.
struct BatchBuffers {
  int32_t* input_ids = nullptr;
  int32_t* labels = nullptr;
  int32_t* position_ids = nullptr;
  int32_t* document_ids = nullptr;  // null unless the step was compiled for packed samples
};

struct DeviceStepResult {
  double loss_sum = 0;   // the micro batches' losses, summed
  double grad_norm = 0;  // of the mean gradient, before clipping
  bool applied = false;  // false: a non-finite loss or norm; nothing was updated
};

class DeviceStep {
 public:
  virtual ~DeviceStep() = default;

  // Where the next micro batch goes (pinned host memory of the next free slot; waits, if
  // needed, until that slot's previous copy to the device has been made).
  virtual BatchBuffers staging() = 0;
  // Enqueues the copy of staging() to the device; the next micro_batch() reads it.
  virtual void upload() = 0;
  // Enqueues the compiled step on the last uploaded micro batch: its gradients times `scale`
  // into the fp32 sums (first: replacing them), its loss into the step's loss sum.
  virtual void micro_batch(bool first, float scale) = 0;
  // Enqueues the gradient norm, clipping to `max_norm` (<= 0: none) and AdamW at `lr` for
  // optimizer step `step` (1-based).
  virtual void optimizer(const AdamWParams& params, double lr, int64_t step, double max_norm) = 0;
  // Waits for everything enqueued; a UserError for a data error the kernels found.
  virtual DeviceStepResult finish() = 0;

  // The whole state in and out (synchronous): parameters and both moments of every tensor
  // of ModelState::specs, fp32. load() also sets the bf16 copy.
  virtual void load(const ModelState& state) = 0;
  // Fills state.params (and, with moments, exp_avg and exp_avg_sq), whole tensors.
  virtual void download(ModelState& state, bool moments) = 0;

  virtual int64_t state_bytes() const = 0;  // the flat buffers, the constants' included, on the device
  virtual int64_t arena_bytes() const = 0;  // the step's arena and its inputs' block
};

// `joint`: the step compiled for the cuda backend in bf16, gradients unreduced (no grad_sync:
// its outputs are "loss", this rank's part of its replica's loss, and "grad:<name>" of every
// parameter, bf16, this rank's part of the gradient). micro_batch x seq_len tokens; `packed`: it has the
// document_ids input. A UserError, before anything is allocated, when the planned state and
// arena do not fit in the device's free memory; a UserError in a build without the cuda
// backend.
// `groups`: this rank's (their MPI groups; null or one rank: no reduction).
// `constants`: the tensors the step reads and nothing trains (models::Model::constants), with
// their fp32 values; copied to the device once, in bf16, and bound there.
struct DeviceConstants {
  const std::vector<models::ParameterSpec>& specs;
  const std::vector<std::vector<float>>& values;
};
std::unique_ptr<DeviceStep> make_device_step(const Graph& joint, const std::vector<models::ParameterSpec>& specs,
                                             const DeviceConstants& constants, int64_t tokens, bool packed,
                                             const ProcessGroups* groups = nullptr);

}  // namespace autosp::train
