// A watch on every key under a prefix, through etcd's JSON gateway
// (POST /v3/watch: a stream of {"result": {...}} objects, one per line).
// It tells its owner about every change, and about every moment it cannot
// vouch for what it saw: each time it is (re)created the owner learns the
// watch is live again, and each time it breaks the owner learns it is not,
// so that nothing read before is trusted as if no change could have been
// missed. It reconnects on its own (every `retry`) until stopped.
#pragma once

#include <corma/directory.hpp>

#include <optional>

#include "etcd_client.hpp"

#include <corma/error.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace corma::directory {

class KeyWatch : public std::enable_shared_from_this<KeyWatch> {
 public:
  /// One change to a key under the prefix.
  struct Change {
    std::string key;
    std::optional<std::string> value;  ///< what was put; none: the key was deleted
    std::int64_t revision = 0;         ///< etcd's revision of the change
  };

  struct Callbacks {
    /// A key under the prefix was put or deleted.
    std::function<void(const Change& change)> changed;
    /// The watch is live (true: every change from now on is reported) or
    /// broken (false: changes may be missed until it is live again).
    std::function<void(bool live)> live;
  };

  /// Watches through one of the members at a time: each time the watch
  /// breaks, it is made again through the next.
  KeyWatch(boost::asio::any_io_executor executor, EtcdAccess access, std::string prefix,
           std::chrono::milliseconds retry, Callbacks callbacks);

  /// Starts watching (and reconnecting) in the background.
  void start();
  /// Stops for good; no callback runs after it.
  void stop();

 private:
  struct Stream;
  boost::asio::awaitable<void> run();
  /// One connection's watch, until it breaks; whether it ever went live.
  boost::asio::awaitable<bool> watch_once();
  /// Handles one line of the stream; false when etcd cancelled the watch
  /// or the line cannot be read whole (the watch is then broken: a change
  /// may have been missed).
  bool take(const std::string& line);
  bool take_result(const std::string& line);

  boost::asio::any_io_executor executor_;
  EtcdAccess access_;
  std::size_t current_ = 0;
  std::string prefix_;
  std::chrono::milliseconds retry_;
  Callbacks callbacks_;
  boost::asio::steady_timer pause_;
  /// Never expires; stop() cancels it, ending the connect and TLS handshake
  /// it races (they have no stream to close yet).
  boost::asio::steady_timer stopping_;
  std::shared_ptr<Stream> stream_;
  bool stopped_ = false;
  bool live_ = false;
};

}  // namespace corma::directory
