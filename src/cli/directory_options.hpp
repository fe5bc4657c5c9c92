// The `corma` commands' view of the directory: its config from the command
// line, an owner's announcement, and `corma ls`.
#pragma once

#include "commands.hpp"

#include <corma/directory.hpp>

#include <boost/asio/ip/tcp.hpp>

namespace corma::cli {

[[nodiscard]] Result<DirectoryConfig> directory_config(const DirectoryOptions& options);

/// The id `corma serve` announces and proves: --owner-id, or HOST-PORT.
[[nodiscard]] std::string serve_owner_id(const ServeOptions& options, std::uint16_t port);

/// What `corma serve` announces: its endpoint and transport, and its
/// prefixes ("" when none were named: every file under its root).
[[nodiscard]] Announcement serve_announcement(const ServeOptions& options, const boost::asio::ip::tcp::endpoint& bound,
                                              bool rdma);

}  // namespace corma::cli
