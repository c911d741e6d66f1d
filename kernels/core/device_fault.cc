#include "kernels/core/device_fault.h"

#include <map>

#include "absl/synchronization/mutex.h"

namespace qlinear {
namespace {

struct State {
  absl::Mutex mu;
  std::optional<std::string> fault ABSL_GUARDED_BY(mu);
  std::map<int, std::function<void(const std::string&)>> listeners ABSL_GUARDED_BY(mu);
  int next_id ABSL_GUARDED_BY(mu) = 1;
};

State& state() {
  static State* s = new State;  // never destroyed: reports may come during exit
  return *s;
}

}  // namespace

void report_device_fault(const std::string& what) {
  State& s = state();
  absl::MutexLock lock(&s.mu);
  if (s.fault.has_value()) return;
  s.fault = what;
  for (auto& [id, listener] : s.listeners) listener(what);
}

std::optional<std::string> device_fault() {
  State& s = state();
  absl::MutexLock lock(&s.mu);
  return s.fault;
}

int add_device_fault_listener(std::function<void(const std::string&)> listener) {
  State& s = state();
  absl::MutexLock lock(&s.mu);
  const int id = s.next_id++;
  if (s.fault.has_value()) listener(*s.fault);
  s.listeners.emplace(id, std::move(listener));
  return id;
}

void remove_device_fault_listener(int id) {
  State& s = state();
  absl::MutexLock lock(&s.mu);
  s.listeners.erase(id);
}

void clear_device_fault_for_testing() {
  State& s = state();
  absl::MutexLock lock(&s.mu);
  s.fault.reset();
}

}  // namespace qlinear
