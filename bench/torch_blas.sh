# Sourced by the benchmark scripts that run PyTorch on the CPU (after PYTHON is set): makes sure
# that PyTorch's dense products run the BLAS kernels of this CPU and that its allocator runs in
# its steady state, and says which. Scripts start PyTorch as `env "$TORCH_ENV" "$PYTHON" ...`.
#
# Kernels. Debian's PyTorch does its float products through the system BLAS (OpenBLAS), which
# picks its kernels from the CPU model. Two things can keep it from the best ones:
# - A machine may set OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) for every program, because older
#   OpenBLAS builds crash or compute wrong results on some processors. Seen: Haswell (AVX2) set on
#   an AVX-512 AMD EPYC (family 26) where OpenBLAS 0.3.21 itself picks Cooperlake; the confusion
#   script took 24.5 ms per image (median of 64) with Haswell against 19.1 with Cooperlake. The
#   benchmark drops both and lets OpenBLAS pick; BENCH_OPENBLAS_CORETYPE names kernels to force.
#   The scripts compare PyTorch's results with attnscope's, so kernels that compute wrong
#   results show up there.
# - A model OpenBLAS does not know (seen: family 6 model 207, under KVM, with OpenBLAS 0.3.21)
#   falls back to "Prescott", its SSE3 kernels: torch.nn.functional.linear at DeiT-T shape then
#   runs 2.6x slower than with the AVX-512 kernels the CPU has, and every comparison against
#   PyTorch would flatter attnscope. When OpenBLAS picks Prescott on a CPU with AVX-512 (F, BW, DQ,
#   VL) or AVX2 + FMA, OPENBLAS_CORETYPE names the matching kernels (SkylakeX, Haswell).
#
# Allocator. glibc's malloc gives freed memory back to the kernel (heap trimming, and large blocks
# mmap'd and unmapped each time) and moves its mmap threshold with the sizes it sees, so PyTorch's
# per-image temporaries come either from the heap or from fresh zeroed pages, and its times
# switched between two modes within one run (seen: the confusion script's median 18 ms per image
# in one run and 47 ms in the next, with 17 ms images in both). TORCH_ENV starts PyTorch with
# trimming and mmap off for blocks below 256 MiB (GLIBC_TUNABLES), which holds it in its fast mode:
# the comparison is against PyTorch at its best. attnscope runs with glibc's defaults.
BENCH_TORCH_TUNABLES=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824
# shellcheck disable=SC2034  # used by the scripts that source this file
TORCH_ENV=GLIBC_TUNABLES=$BENCH_TORCH_TUNABLES
torch_blas_core() {
  OPENBLAS_VERBOSE=2 "$PYTHON" -c 'import numpy as n; a = n.ones((64, 64)); a @ a' 2>&1 |
    sed -n 's/^Core: //p' | head -1
}
_machine_core=${OPENBLAS_CORETYPE:-}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
if [ -n "${BENCH_OPENBLAS_CORETYPE:-}" ]; then
  export OPENBLAS_CORETYPE=$BENCH_OPENBLAS_CORETYPE
elif [ "$(torch_blas_core)" = Prescott ]; then
  _flags=$(grep -m1 '^flags' /proc/cpuinfo)
  _has() { case " $_flags " in *" $1 "*) return 0 ;; esac; return 1; }
  if _has avx512f && _has avx512bw && _has avx512dq && _has avx512vl; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif _has avx2 && _has fma; then
    export OPENBLAS_CORETYPE=Haswell
  fi
  unset _flags
  unset -f _has
fi
echo "OpenBLAS kernels for PyTorch: $(torch_blas_core)${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}" \
  "${_machine_core:+(OPENBLAS_CORETYPE=$_machine_core of the environment dropped)}; PyTorch's malloc: GLIBC_TUNABLES=$BENCH_TORCH_TUNABLES"
unset _machine_core
