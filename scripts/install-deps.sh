#!/usr/bin/env bash
# Installs the Debian packages attnscope needs, only those missing. Quiet when all are present.
# Usage: scripts/install-deps.sh [build|python|all]   (default all)
set -euo pipefail
what=${1:-all}
build_pkgs=(cmake ninja-build g++ make libeigen3-dev libhdf5-dev hdf5-tools
            libboost-program-options-dev libgtest-dev libgmock-dev libbenchmark-dev
            nlohmann-json3-dev time libopenmpi-dev openmpi-bin libssl-dev libxxhash-dev pkgconf
            pybind11-dev python3-dev)
python_pkgs=(python3 python3-numpy python3-h5py python3-torch python3-torchvision python3-pytest
             python3-matplotlib python3-nbclient python3-nbconvert python3-nbformat python3-ipykernel
             libopenblas0-openmp dataset-fashion-mnist)
case "$what" in
  build) pkgs=("${build_pkgs[@]}") ;;
  python) pkgs=("${python_pkgs[@]}") ;;
  all) pkgs=("${build_pkgs[@]}" "${python_pkgs[@]}") ;;
  *) echo "install-deps.sh: unknown set '$what' (expected build, python or all)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
