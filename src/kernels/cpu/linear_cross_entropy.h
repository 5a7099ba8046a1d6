// The LM head and its loss fused: cross-entropy of logits = x W^T without ever holding the
// [T, V] logits. Rows are processed chunk_rows at a time; each chunk's logits live in a
// [chunk_rows, V] workspace, and the backward recomputes them rather than saving them.
//
// Layouts (row-major, contiguous): x, dx [T, H]; W, dW [V, H]; labels, lse [T].
// Rows with label == ignore_index contribute nothing; labels of the other rows are already
// validated to lie in [0, V) by the caller. Outputs are overwritten, never accumulated into.
//
// The results do not depend on the thread count: rows are independent, loss_sum is summed
// as cross_entropy_forward sums it within a chunk (fixed row blocks, double) and over the
// chunks in chunk order, and dW sums the chunks in chunk order. They do depend on
// chunk_rows (dW's summation order and gemm blocking), at fp32 rounding level.
//
// softcap c > 0 (Gemma 2's final_logit_softcapping): the logits are c tanh(x W^T / c), capped
// by the row passes on the fly (cross_entropy_forward's softcap), so no more memory.
#pragma once
#include <cstdint>

namespace autosp::cpu {

// Workspace sizes in floats; the caller allocates them (so the executor's allocator
// counts them). O(min(T, chunk_rows) * V).
int64_t linear_cross_entropy_forward_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows);
int64_t linear_cross_entropy_backward_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows);

// lse[t] = log sum_v exp(z[t, v]) with z = x W^T (written for every row);
// loss_sum = sum over labelled t of lse[t] - z[t, label[t]].
void linear_cross_entropy_forward(const float* x, const float* W, const int32_t* labels,
                                  int64_t T, int64_t H, int64_t V, int32_t ignore_index,
                                  int64_t chunk_rows, float* loss_sum /* [1] */, float* lse,
                                  float* workspace, float softcap = 0.0f);

// With dz[t, :] = dloss_sum (softmax(z[t]) - onehot(label[t])) on labelled rows, 0 else:
// dx = dz W,  dW = dz^T x.
void linear_cross_entropy_backward(const float* dloss_sum /* [1] */, const float* x,
                                   const float* W, const int32_t* labels, const float* lse,
                                   int64_t T, int64_t H, int64_t V, int32_t ignore_index,
                                   int64_t chunk_rows, float* dx, float* dW, float* workspace,
                                   float softcap = 0.0f);

// Both at once, for a training step whose dloss_sum is known before the loss (it is: the
// seed over the label count): per chunk the logits once, their lse and loss, dz in place,
// then dx_c = dz W and dW += dz^T x_c. loss_sum equals linear_cross_entropy_forward's and
// dx, dW linear_cross_entropy_backward's bit for bit (the same chunks, gemms and row passes),
// with one gemm of the three-plus-one saved: the backward's recomputation of the logits.
// An all-ignored chunk adds nothing to the loss and skips its gemms, as the backward does.
int64_t linear_cross_entropy_with_grad_workspace_floats(int64_t T, int64_t V, int64_t chunk_rows);
void linear_cross_entropy_with_grad(const float* x, const float* W, const int32_t* labels,
                                    const float* dloss_sum /* [1] */, int64_t T, int64_t H, int64_t V,
                                    int32_t ignore_index, int64_t chunk_rows, float* loss_sum /* [1] */,
                                    float* dx, float* dW, float* workspace, float softcap = 0.0f);

}  // namespace autosp::cpu
