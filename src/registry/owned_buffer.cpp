#include <corma/owned_buffer.hpp>

#include <unistd.h>

#include <cstdlib>
#include <new>

namespace corma {

OwnedBuffer OwnedBuffer::allocate(std::size_t size) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t rounded = (size + page - 1) / page * page;
  if (size == 0 || rounded < size) throw std::bad_alloc();
  void* p = std::aligned_alloc(page, rounded);
  if (p == nullptr) throw std::bad_alloc();
  OwnedBuffer buffer;
  buffer.data_.reset(static_cast<std::byte*>(p));
  buffer.size_ = size;
  return buffer;
}

void OwnedBuffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

}  // namespace corma
