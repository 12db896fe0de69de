// Outputs of one head computed fast for a forward pass (replay): the same operations as
// attention_outputs<double>, in the same order, so the same bits, with the products on packed
// operands (portable::gemm_packed), the exponentials and the row loops vectorised, the sums of
// several rows interleaved, and no allocation once a thread's scratch has grown. Two forms:
// the score form (softmax, with or without a mask: softmax.hpp's softmax_rows between two
// products) and the kernel form's linear-time outputs (no mask). attention_outputs stays the
// plain path; tests/unit/test_replay_fast.cpp compares them bit for bit on every family.
#pragma once

#include "attnscope/attention.hpp"

#include <vector>

namespace attnscope {

/// out (rows x dv, row stride ldo) = W V for the query rows [0, rows) of q (row stride ldq),
/// W = softmax rows of scale * q k^T over the keys `mask` keeps (rows x n, null: every key),
/// k n x d (ldk), v n x dv (ldv): row i equals row i of attention_outputs<double>(softmax, ...)
/// bit for bit, whatever `rows` (a row depends on its own query only). Rows that keep no key are
/// zero and appended to `degenerate` (when given). Does not check that the outputs are finite.
void softmax_head_outputs(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k, Eigen::Index ldk,
                          const double* v, Eigen::Index ldv, Eigen::Index n, Eigen::Index d, Eigen::Index dv,
                          double scale, const Mask* mask, double* out, Eigen::Index ldo,
                          std::vector<int>* degenerate = nullptr);

/// The same outputs in float, PyTorch's precision (`replay --attention float`): q, k and v rounded
/// to float, E = exp_float(scale * q k^T - the row's largest) with gemm_packed<float> and each row's
/// sum s_i in double (portable::exp_floats_sum's order), then E V with gemm_packed<float>, widened
/// into `out`, row i divided by s_i in double (the division after the product: PyTorch divides the
/// weights, the same value up to rounding). No mask. Every step has a fixed order, so the bits do
/// not depend on the CPU, but they are not softmax_head_outputs': tests/unit/test_replay_fast.cpp
/// bounds the difference.
/// Returns false, having written nothing, when a value of q, k or v rounds to an infinite float
/// or a scaled logit is not finite in float: the caller then computes the head in double.
[[nodiscard]] bool softmax_head_outputs_float(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                                              Eigen::Index ldk, const double* v, Eigen::Index ldv, Eigen::Index n,
                                              Eigen::Index d, Eigen::Index dv, double scale, double* out,
                                              Eigen::Index ldo);

/// The linear-time outputs of a kernel family (v.linear_time_outputs()), no mask, for the query rows
/// [0, rows) (token positions 0..rows-1) against the n keys: row i equals row i of
/// attention_outputs<double>(v, q, k, values, scale) bit for bit when rows = n, and for any rows
/// where query_features_row_local(v); the same errors are thrown (features or outputs not
/// finite, a row form that overflows). Layout as softmax_head_outputs.
void kernel_head_outputs(const Variant& v, const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                         Eigen::Index ldk, const double* values, Eigen::Index ldv, Eigen::Index n, Eigen::Index d,
                         Eigen::Index dv, double scale, double* out, Eigen::Index ldo);

/// Whether v's query features of a row are the same bits whatever other rows are computed with it:
/// false for the relu_affine map, whose A q is one Eigen product over all the rows given (a
/// matrix-vector product for one row sums in another order than a matrix product for many).
[[nodiscard]] bool query_features_row_local(const Variant& v);

}  // namespace attnscope
