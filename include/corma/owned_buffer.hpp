// OwnedBuffer: page-aligned memory a Registry can own for the lifetime of a
// registration.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace corma {

class OwnedBuffer {
 public:
  OwnedBuffer() = default;

  /// Page-aligned, uninitialised memory of `size` bytes (size > 0).
  /// Throws std::bad_alloc when the memory is not there.
  [[nodiscard]] static OwnedBuffer allocate(std::size_t size);

  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_.get(), size_}; }
  [[nodiscard]] explicit operator bool() const noexcept { return data_ != nullptr; }

  /// Gives the memory up without freeing it: for memory a provider may still
  /// be using, where a leak is the only safe outcome.
  std::byte* leak() noexcept {
    size_ = 0;
    return data_.release();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte[], Free> data_;
  std::size_t size_ = 0;
};

}  // namespace corma
