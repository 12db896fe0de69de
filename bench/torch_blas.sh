# Sourced by the benchmark scripts that run PyTorch on the CPU (after PYTHON is set): makes sure
# that PyTorch's dense products run the BLAS kernels of this CPU, and says which.
#
# Debian's PyTorch does its float products through the system BLAS (OpenBLAS). OpenBLAS picks its
# kernels from the CPU model, and a model it does not know (seen: family 6 model 207, under KVM,
# with OpenBLAS 0.3.21) falls back to "Prescott", its SSE3 kernels: torch.nn.functional.linear at
# DeiT-T shape then runs 2.6x slower than with the AVX-512 kernels the CPU has, and every
# comparison against PyTorch would flatter attnscope. When OpenBLAS reports Prescott on a CPU with
# AVX-512 (F, BW, DQ, VL) or AVX2 + FMA, OPENBLAS_CORETYPE names the matching kernels (SkylakeX,
# Haswell); a value the caller set is kept. The outcome is printed on the script's first lines.
torch_blas_core() {
  OPENBLAS_VERBOSE=2 "$PYTHON" -c 'import numpy as n; a = n.ones((64, 64)); a @ a' 2>&1 |
    sed -n 's/^Core: //p' | head -1
}
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  _core=$(torch_blas_core)
  if [ "$_core" = Prescott ]; then
    _flags=$(grep -m1 '^flags' /proc/cpuinfo)
    _has() { case " $_flags " in *" $1 "*) return 0 ;; esac; return 1; }
    if _has avx512f && _has avx512bw && _has avx512dq && _has avx512vl; then
      export OPENBLAS_CORETYPE=SkylakeX
    elif _has avx2 && _has fma; then
      export OPENBLAS_CORETYPE=Haswell
    fi
  fi
  unset _flags _core
  unset -f _has
fi
echo "OpenBLAS kernels for PyTorch: $(torch_blas_core)${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
