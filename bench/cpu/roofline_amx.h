// The AMX multiply rate of one core: TDPBUSD on tiles that stay in the tile registers (no loads),
// the limit of cpu.amx at large M.
//
// Compiled with AMX and AVX-512 flags; call only on hosts that passed amx_isa_status().
#pragma once

#include <cstdint>

namespace qlinear::bench {

// Configures this thread's tiles, runs `iterations` x 4 independent TDPBUSD (16 x 16 x 64
// multiply-adds each, i.e. 32768 operations), releases the tiles; returns a value that depends on
// them.
uint64_t tdpbusd_loop_amx(int64_t iterations);

}  // namespace qlinear::bench
