// Launch configurations for cudaLaunchKernelEx: with thread-block clusters along x, also for
// cudaOccupancyMaxActiveClusters (the kernels that split a row or a reduction among the blocks of
// a cluster: cuda.gemv_s8, the quantize kernel's long rows), and as a programmatic dependent.
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

// A launch configuration without clusters, marked as the programmatic dependent of the stream's
// previous kernel where `dependent` (the hand-written kernels launched after the quantize kernel:
// cuda.stream_s8, cuda.cutlass_sm90's stream-K tile).
struct DependentLaunch {
  DependentLaunch(unsigned blocks, unsigned threads, size_t smem_bytes, cudaStream_t stream,
                  bool dependent) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = dependent ? 1 : 0;
  }
  // config points into this object.
  DependentLaunch(const DependentLaunch&) = delete;
  DependentLaunch& operator=(const DependentLaunch&) = delete;

  cudaLaunchAttribute attr[1] = {};
  cudaLaunchConfig_t config = {};
};

}  // namespace qlinear::gpu
