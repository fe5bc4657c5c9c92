// A served file's bytes, read whole into memory the server owns, as one
// version of the file. The server never maps a served file: a file
// truncated under a mapping kills the reader with SIGBUS, and a file
// rewritten under one hands out a mix of two versions. A snapshot cannot
// change, so every consumer that reads it gets exactly one version.
#pragma once

#include <corma/error.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace corma::cli {

class SnapshotBudget;

class FileSnapshot {
 public:
  /// Holds `size` bytes already taken from `budget` (SnapshotBudget::take),
  /// and gives them back when it goes (or when allocating them fails).
  FileSnapshot(std::size_t size, std::shared_ptr<SnapshotBudget> budget);
  ~FileSnapshot();
  FileSnapshot(const FileSnapshot&) = delete;
  FileSnapshot& operator=(const FileSnapshot&) = delete;

  [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_.get(), size_}; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_.get(), size_}; }

 private:
  std::size_t size_;
  std::shared_ptr<SnapshotBudget> budget_;
  std::unique_ptr<std::byte[]> data_;
};

/// Reads `out.size()` bytes of the open file `fd` from its start into `out`
/// (`name` for messages): `object_changed` if the file ends sooner,
/// `backend` if reading fails, `cancelled` once `stop` is set (checked
/// between chunks of `read_chunk` bytes).
Result<void> read_into(int fd, std::span<std::byte> out, std::string_view name,
                       const std::atomic<bool>* stop = nullptr);

/// How much read_into() reads between two looks at its stop flag: a read
/// nobody wants any more ends within one chunk.
inline constexpr std::size_t read_chunk = std::size_t{8} << 20;

}  // namespace corma::cli
