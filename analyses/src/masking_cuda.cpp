// Masking on the GPU (mask_head_cuda, masking.hpp): the head's weights and both outputs on the
// device (gpu/attention.hpp), the statistics on the host with the CPU path's mask_statistics.
#include "attnscope/analyses/masking.hpp"

#include "attnscope/gpu/attention.hpp"

namespace attnscope::analyses {

MaskCell mask_head_cuda(const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                        double scale, const Mask& mask) {
  Diagnostics plain, masked;
  const gpu::WeightsAndOutputs plain_run =
      gpu::attention_weights_and_outputs(v, q, k, values, scale, nullptr, &plain);
  const MatD o_masked = gpu::attention_outputs(v, q, k, values, scale, &mask, &masked);
  return mask_statistics(plain_run.weights, plain_run.outputs, o_masked, plain, masked, mask);
}

}  // namespace attnscope::analyses
