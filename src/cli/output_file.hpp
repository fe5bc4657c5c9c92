// The file corma get writes: created up front and written chunk by chunk as
// a fetch streams in (Consumer::async_fetch_to), or mapped for an RDMA read
// to land in; removed again if the fetch fails, so a failed fetch never
// leaves a partial file behind.
#pragma once

#include <corma/consumer.hpp>

#include <filesystem>

namespace corma::cli {

class OutputFile {
 public:
  /// Creates (or truncates) `path`; `not_configured` when it cannot be opened.
  static Result<OutputFile> create(std::filesystem::path path);

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  /// Removes the file unless keep() was called (a regular file only: a
  /// device or a pipe named as the output is never removed).
  ~OutputFile();

  /// Writes each chunk at its offset (`backend` with the system's reason
  /// when a write fails: a full disk ends the fetch).
  [[nodiscard]] ChunkSink sink();
  /// Where a fetch writes this file: chunks through sink(), run on
  /// `writer` (a file thread, so that the consumer's loop goes on reading
  /// while a chunk is written), an RDMA read straight into a shared mapping
  /// of the file (sized to the object), so the bytes reach the file with no
  /// copy. Anything but a regular file (a pipe, /dev/null) is written
  /// through the sink alone.
  [[nodiscard]] StreamDestination destination(const boost::asio::any_io_executor& writer);
  /// The file sized to `size` bytes and mapped shared, writable: what an
  /// RDMA read or a push lands in. Unmapped once the keepalive goes.
  /// `not_configured` for anything but a regular file.
  [[nodiscard]] Result<Landing> map(std::uint64_t size);
  /// Cuts the file to `size` bytes (an object that shrank between the size
  /// asked for and the push).
  Result<void> truncate(std::uint64_t size);
  /// The fetch succeeded: the file stays. `backend` if closing it failed.
  Result<void> keep();

 private:
  OutputFile(std::filesystem::path path, int fd, bool regular)
      : path_(std::move(path)), fd_(fd), regular_(regular) {}

  std::filesystem::path path_;
  int fd_ = -1;
  bool regular_ = false;
  bool kept_ = false;
};

}  // namespace corma::cli
