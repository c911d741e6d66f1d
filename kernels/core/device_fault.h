// A fault that leaves a device unusable for the rest of the process: a CUDA context hit by an
// illegal address, a failed launch or an uncorrectable ECC error keeps failing every later call
// ("sticky" errors), and only a new process gets a new context. The kernel family that sees one
// reports it here; the server's health checks read it, so that the process is taken out of
// service and restarted instead of answering INTERNAL for ever.
//
// Thread-safe. The first report is kept; later ones are ignored.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace qlinear {

// Records `what` (e.g. "cuda:0: cudaErrorIllegalAddress in cudaStreamSynchronize ...") as the
// process's device fault, unless one is recorded, and calls the listeners with it.
void report_device_fault(const std::string& what);

// The recorded fault, if any.
std::optional<std::string> device_fault();

// Calls `listener` with the fault when one is reported (at once, from add_device_fault_listener,
// where one already is). Listeners run under the module's lock: they must not call back into this
// module, and should be quick (set a flag, log a line). Returns an id for removal.
int add_device_fault_listener(std::function<void(const std::string&)> listener);
// After it returns, the listener is not running and will not be called.
void remove_device_fault_listener(int id);

// Forgets the recorded fault (tests only: a real fault is not cleared by anything but a restart).
void clear_device_fault_for_testing();

}  // namespace qlinear
