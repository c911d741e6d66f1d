// A launch configuration with thread-block clusters along x, for cudaLaunchKernelEx and
// cudaOccupancyMaxActiveClusters (the kernels that split a row or a reduction among the blocks of
// a cluster: cuda.gemv_s8, the quantize kernel's long rows).
//
// Compiled by nvcc and by the host compiler: plain C++ only (see quantize_s8.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace qlinear::gpu {

struct ClusterLaunch {
  ClusterLaunch(unsigned blocks, unsigned threads, unsigned cluster, size_t smem_bytes,
                cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  // config points into this object.
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;

  cudaLaunchAttribute attr[1] = {};
  cudaLaunchConfig_t config = {};
};

}  // namespace qlinear::gpu
