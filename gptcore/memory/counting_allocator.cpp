// A counting CPU allocator (gptcore/memory/allocator.py builds and loads it). Installed in front of c10's CPU
// allocator, it hands out the same memory and counts the bytes of every allocation made through it: eager ATen
// ops, inductor's generated wrapper (empty_strided_cpu), kernels' own scratch and extensions alike. Like CUDA's
// caching allocator statistics: the bytes allocated now, their peak, and a reset of the peak to now.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace {

class Counting final : public c10::Allocator {
 public:
  c10::Allocator* inner = nullptr;

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr given = inner->allocate(nbytes);
    void* data = given.get();
    // c10's default CPU allocator hands out a plain pointer (its context is the data): that is what is counted
    if (data == nullptr || given.get_context() != data) return given;
    c10::DeleterFnPtr inner_delete = given.get_deleter();
    given.release_context();
    {
      std::lock_guard<std::mutex> guard(lock_);
      owned_[data] = {nbytes, inner_delete};
      allocated_ += static_cast<int64_t>(nbytes);
      allocations_ += 1;
      if (allocated_ > peak_) peak_ = allocated_;
    }
    return {data, data, &Counting::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Counting::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void release(void* data);

  int64_t allocated() {
    std::lock_guard<std::mutex> guard(lock_);
    return allocated_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> guard(lock_);
    return peak_;
  }
  int64_t allocations() {
    std::lock_guard<std::mutex> guard(lock_);
    return allocations_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> guard(lock_);
    peak_ = allocated_;
  }

 private:
  std::mutex lock_;
  std::unordered_map<void*, std::pair<size_t, c10::DeleterFnPtr>> owned_;
  int64_t allocated_ = 0, peak_ = 0, allocations_ = 0;
};

// made once and never destroyed: tensors are still freed while the process exits, after static destructors ran
Counting& counting = *new Counting();

void Counting::release(void* data) {
  c10::DeleterFnPtr inner_delete = nullptr;
  {
    std::lock_guard<std::mutex> guard(counting.lock_);
    auto it = counting.owned_.find(data);
    if (it == counting.owned_.end()) return;
    counting.allocated_ -= static_cast<int64_t>(it->second.first);
    inner_delete = it->second.second;
    counting.owned_.erase(it);
  }
  inner_delete(data);
}

}  // namespace

extern "C" {
// Count from now on: 1 where c10 now allocates through the counting allocator, 0 where it kept another one.
int gptcore_install() {
  if (counting.inner == nullptr) counting.inner = c10::GetCPUAllocator();
  if (c10::GetCPUAllocator() != &counting) c10::SetCPUAllocator(&counting, /*priority=*/UINT8_MAX);
  return c10::GetCPUAllocator() == &counting ? 1 : 0;
}
// Back to the allocator it stood in front of. What was allocated while counting is still counted when freed.
void gptcore_uninstall() {
  if (counting.inner != nullptr && c10::GetCPUAllocator() == &counting) {
    c10::SetCPUAllocator(counting.inner, /*priority=*/UINT8_MAX);
  }
}
int64_t gptcore_allocated() { return counting.allocated(); }
int64_t gptcore_peak() { return counting.peak(); }
int64_t gptcore_allocations() { return counting.allocations(); }
void gptcore_reset_peak() { counting.reset_peak(); }
}
