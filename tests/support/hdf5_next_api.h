/* HDF5 1.12 and 1.14 changed the signature behind some unsuffixed names: in their default API (and
 * under H5_USE_112_API / H5_USE_114_API) H5Oget_info, H5Oget_info_by_name, H5Oget_info_by_idx,
 * H5Ovisit and H5Ovisit_by_name take a `fields` argument that the 1.10 forms lack. On a 1.10
 * header this file maps each of those names to the 1.10 function with the same arguments as the
 * later version, so that a call written for the 1.10 form fails to compile here as it would
 * against 1.12 or 1.14. Force-included (-include) after <hdf5.h> by the hdf5_api tests. */
#ifndef ATTNSCOPE_HDF5_NEXT_API_H
#define ATTNSCOPE_HDF5_NEXT_API_H
#include <hdf5.h>
#if !H5_VERSION_GE(1, 12, 0)
#define H5Oget_info(...) H5Oget_info2(__VA_ARGS__)
#define H5Oget_info_by_name(...) H5Oget_info_by_name2(__VA_ARGS__)
#define H5Oget_info_by_idx(...) H5Oget_info_by_idx2(__VA_ARGS__)
#define H5Ovisit(...) H5Ovisit2(__VA_ARGS__)
#define H5Ovisit_by_name(...) H5Ovisit_by_name2(__VA_ARGS__)
#endif
#endif
