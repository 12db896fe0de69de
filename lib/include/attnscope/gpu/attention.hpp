// Attention of one head on the GPU (the kernels of lib/cuda/), for every family of the registry:
// the GPU side of attention.hpp, function for function where the GPU has one. Nothing here names
// a family: softmax's score form is computed on the device from q and k, every other family's
// kernel form from the features and row forms the registry gives on the host (kernel_features
// and kernel_row_form, as attention.cpp computes them), under a mask or not.
//
// Inputs as attention.hpp's (layout.hpp: q, k are N x d, values N x dv, row-major), in double;
// q and k of one shape. Results are double, equal to the CPU's to rounding (another summation
// order); degenerate rows are 0 and listed in `diag`, as attention.hpp lists them. Each call runs
// on the calling thread's CUDA stream (one per host thread). In a build without CUDA every
// function throws UsageError.
#pragma once

#include "attnscope/attention.hpp"
#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

namespace attnscope::gpu {

/// How the GPU computes v's rows, as the family says (ScoreFamily::rows_are_softmax): true for
/// a score family whose rows are the GPU's softmax rows, false for a kernel family (its features
/// and row forms from the registry); UsageError for a score family the GPU kernels do not
/// compute. Plain host code, in every build.
[[nodiscard]] bool score_rows_on_gpu(const Variant& v);

/// attention_weights<double> on the GPU: explicit N x N weights, under `mask` or not.
/// NumericalError when a weight overflows double.
[[nodiscard]] MatD attention_weights(const Variant& v, const MatD& q, const MatD& k, double scale,
                                     const Mask* mask = nullptr, Diagnostics* diag = nullptr);

/// attention_outputs<double> on the GPU, through the explicit weights on the device (O = W V by
/// DGEMM; the weights never leave the device). NumericalError when an output overflows double.
[[nodiscard]] MatD attention_outputs(const Variant& v, const MatD& q, const MatD& k,
                                     const MatD& values, double scale, const Mask* mask = nullptr,
                                     Diagnostics* diag = nullptr);

/// The weights and their outputs from one computation of the weights on the device: `weights` as
/// attention_weights returns them (checked finite), `outputs` = W V computed on the device and
/// left unchecked, as the host's product `weights * values` would be.
struct WeightsAndOutputs {
  MatD weights;  ///< N x N
  MatD outputs;  ///< N x dv
};
[[nodiscard]] WeightsAndOutputs attention_weights_and_outputs(const Variant& v, const MatD& q,
                                                              const MatD& k, const MatD& values,
                                                              double scale,
                                                              const Mask* mask = nullptr,
                                                              Diagnostics* diag = nullptr);

}  // namespace attnscope::gpu
