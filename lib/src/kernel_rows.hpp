// Library-internal pieces shared by the kernel form's weights, outputs and low-rank form
// (family.hpp): every kernel family gives row i the affine form w_ij = a_i f_q(i).f_k(j) + b_i
// over the kept keys, its RowForm from S_i = f_q(i).sum_kept f_k and the kept count, so outputs
// are o_i = a_i f_q(i) [sum_j f_k(j) v_j^T] + b_i sum_j v_j.
#pragma once

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"

#include <string>

namespace attnscope::detail {

/// Throws UsageError when the variant is not supported or the shapes do not fit.
void check_inputs(const Variant& v, Eigen::Index q_rows, Eigen::Index q_cols, Eigen::Index k_rows,
                  Eigen::Index k_cols, const Mask* mask);

/// The family's key features into out (k.rows() x feature_dim), checked finite; q: the head's
/// queries (KernelFamily::key_features).
void key_features_into(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                       Eigen::Ref<MatD> out);
/// The family's normaliser features g_q (queries at positions 0..) and g_k, checked finite.
void normaliser_features_into(const Variant& v, ConstRef<double> q, ConstRef<double> k, double scale,
                              Eigen::Ref<MatD> gq, Eigen::Ref<MatD> gk);
/// The family's query features into out, checked finite.
void query_features_into(const Variant& v, ConstRef<double> q, TokenPositions positions,
                         Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out);

}  // namespace attnscope::detail
