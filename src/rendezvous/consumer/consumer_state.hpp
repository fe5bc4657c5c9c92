// The state of one Consumer and the steps of a fetch: requests on the
// connection, chunked reads, RDMA gets, and releases. consumer.cpp holds the
// public operations; fetch_many.cpp the batch of many objects.
#pragma once

#include "rendezvous/consumer/consumer_link.hpp"
#include "rendezvous/consumer/in_flight_limit.hpp"
#include "rendezvous/consumer/lease_keeper.hpp"
#include "rendezvous/consumer/sink.hpp"

#include <corma/consumer.hpp>
#include <corma/descriptor.hpp>

#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace corma {

namespace rendezvous {

/// Pull size on the fallback path, where the owner named no chunk size.
inline constexpr std::uint32_t fallback_chunk = 256 * 1024;

[[nodiscard]] Error fetch_cancelled(std::string_view when);
/// What the owner's answer to a release (the error code it named, 0 for
/// none) says of the bytes read under the lease: the one rule for a single
/// fetch and a set. `object_changed`: published again while it was read;
/// `region_not_found`: the owner no longer held the lease (it lapsed), so
/// nothing proves the bytes one version (`timeout`); anything else says
/// nothing about the bytes.
[[nodiscard]] Result<void> release_verdict(std::uint16_t code);
/// Whether the fetch running on this coroutine thread has been cancelled.
[[nodiscard]] boost::asio::awaitable<bool> cancelled_here();

/// The bytes of an object a fetch reads: [offset, end()).
struct Slice {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  [[nodiscard]] std::uint64_t end() const noexcept { return offset + length; }
};
/// The slice `range` names in an object of `size` bytes, or `out_of_range`
/// when it does not lie within it: the one rule of every entry point.
[[nodiscard]] Result<Slice> slice_of(const ByteRange& range, std::uint64_t size);

}  // namespace rendezvous

struct Consumer::State {
  using Message = rendezvous::Message;
  template <class T>
  using Awaitable = boost::asio::awaitable<T>;

  boost::asio::any_io_executor executor;
  std::shared_ptr<Registry> registry;
  ConsumerConfig config;
  /// The connection: one reader routing answers by request id, one writer
  /// (consumer_link.hpp); any number of fetches talk on it at once.
  std::shared_ptr<rendezvous::ConsumerLink> link;
  /// Renews every lease the fetches hold, together (lease_keeper.hpp).
  std::shared_ptr<rendezvous::LeaseKeeper> leases;
  /// Fetches running at once; the others wait (ConsumerConfig::max_fetches_in_flight).
  rendezvous::InFlightLimit fetches;
  std::optional<PeerId> peer;
  /// The protocol version agreed in the hello, and the owner's batch limit
  /// (version 2 on).
  std::uint16_t version = 0;
  std::uint16_t max_batch = 1;
  std::string proven_owner;  ///< the id the owner proved, with a cluster key
  boost::asio::ip::tcp::endpoint dialled;  ///< the owner's address, as this side connected to it
  /// A remote key imported for `peer`, and what says it is in use: every
  /// read that names it holds a copy of `users` until its transfer ended.
  struct ImportedKey {
    RemoteKeyId key;
    std::shared_ptr<const void> users = std::make_shared<char>();
    [[nodiscard]] bool in_use() const noexcept { return users.use_count() > 1; }
  };
  /// Hashes a packed key's bytes: a set looks one up per object it reads.
  struct PackedKeyHash {
    std::size_t operator()(const PackedKey& packed) const noexcept {
      return std::hash<std::string_view>{}(
          std::string_view(reinterpret_cast<const char*>(packed.data()), packed.size()));
    }
  };
  /// Remote keys imported for `peer`, by their packed bytes: a key packed the
  /// same way names the same memory, so it is imported once.
  std::unordered_map<PackedKey, ImportedKey, PackedKeyHash> imported_keys;
  /// The RDMA transfers running now: when the owner is lost each is
  /// cancelled (terminal), so that none waits for a dead peer.
  std::set<boost::asio::cancellation_signal*> transfers;
  ConsumerStats stats;
  /// The owner's peer towards this side, for pushes (consumer_push.cpp):
  /// set up by the first push, once; `push_setup` is the set-up under way
  /// (its waiters are woken when it ends), `push_unavailable` why the owner
  /// takes none (asked once per connection).
  std::optional<PeerId> push_peer;
  std::shared_ptr<boost::asio::steady_timer> push_setup;
  std::optional<Error> push_unavailable;

  State(boost::asio::any_io_executor ex, std::shared_ptr<Registry> r, ConsumerConfig c);
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  /// Closes the connection (its reader and lease keeper end with it).
  ~State();

  /// Starts the connection's reader and lease keeper over `socket`.
  void open(boost::asio::ip::tcp::socket socket);
  /// The owner is gone: every transfer is cancelled, the backend's peer
  /// closed (so that it ends what its provider can end, and answers the
  /// rest as unreachable), and the keys imported for it dropped.
  void owner_lost();
  /// Why the owner was lost, if it was.
  [[nodiscard]] std::optional<Error> lost() const;

  // ---- requests ---------------------------------------------------------------

  /// Sends one request and waits for its answer (link->ask).
  Awaitable<Result<Message>> request(Message message);

  // ---- the chunked path ---------------------------------------------------------

  /// One object of pull_objects: its lease, the bytes to read, the chunk
  /// size, and where the bytes go: read straight into `memory` (the slice's
  /// length) when it is given, else handed to `write` chunk by chunk.
  struct PullJob {
    std::uint64_t lease;
    rendezvous::Slice slice;
    std::uint32_t chunk;
    rendezvous::Sink write;
    std::span<std::byte> memory;
  };

  /// Reads the object in chunks, keeping up to `pull_window` pulls on the
  /// wire so that the owner's reads, the network and our copies overlap.
  /// A cancelled fetch stops asking at once (the answers to pulls already
  /// asked are dropped when they come).
  Awaitable<Result<void>> pull_all(PullJob job);
  /// Reads several objects in chunks, in order, with one pull window over
  /// all of them, so that a set of small objects costs round trips by the
  /// window, not by the object. An object that fails stops only itself;
  /// cancellation and a lost connection end them all. One result per job.
  Awaitable<std::vector<Result<void>>> pull_objects(std::vector<PullJob> jobs);

  /// Ends a lease. The owner answers `object_changed` when the object was
  /// published again while the lease read it: then what was read may be a
  /// mix, and the fetch fails. Any other trouble with the answer says
  /// nothing about the bytes and is not the fetch's failure.
  Awaitable<Result<void>> release(std::uint64_t lease);

  // ---- the RDMA path ---------------------------------------------------------------

  /// Begins a transfer: given the cancellation slot it must honour and the
  /// function to call on the consumer's executor once it has answered.
  using StartTransfer = std::function<void(boost::asio::cancellation_slot, std::function<void()>)>;

  /// Runs a transfer to its answer. When the owner is lost the transfer is
  /// cancelled (terminal) rather than left to its own deadline. When the
  /// fetch is cancelled it is waited for all the same (it ends by itself or
  /// by the backend's operation deadline): the lease it reads under must
  /// outlive it. The leases are kept alive meanwhile by the lease keeper.
  /// Returns why it was stopped, or nothing.
  Awaitable<std::optional<Error>> run_transfer(const StartTransfer& start);

  /// Gets `part` of the `len` bytes a descriptor names (offsets within
  /// them) into `guard` at `offset`.
  Awaitable<Result<void>> read_remote(const std::vector<std::byte>& descriptor, std::uint64_t len,
                                      rendezvous::Slice part, RegionGuard& guard, std::uint64_t offset);
  /// Reads `slice` of an object lent in windows into `guard` at `base`: the
  /// part of each window within it where it belongs, then the next window
  /// asked for (skipping to the slice's start with a version 5 owner), until
  /// the slice is whole; `sink` (may be empty) is handed each part as it
  /// lands. `windows` counts the windows read.
  Awaitable<Result<void>> read_windows(const rendezvous::RdmaWindow& first, rendezvous::Slice slice,
                                       RegionGuard& guard, std::uint64_t base, const rendezvous::Sink& sink,
                                       std::uint32_t& windows);
  /// A read into a registered region, at `base` in it.
  using ReadInto = std::function<Awaitable<Result<void>>(RegionGuard& guard, std::uint64_t base)>;
  /// `read` into `guard`, memory registered for it alone (at its start),
  /// deregistered after; a failed read's memory is handed to `keep_until`.
  Awaitable<Result<void>> rdma_get(RegionGuard guard, const std::function<void(DeregisteredEvent)>& keep_until,
                                   const ReadInto& read);
  /// The key imported for `packed` (once per packed key and peer), held in
  /// use, and so never let go, while the caller keeps `hold`.
  struct KeyInUse {
    RemoteKeyId key;
    std::shared_ptr<const void> hold;
  };
  Awaitable<Result<KeyInUse>> key_for(const PackedKey& packed);
  /// The same for a key imported already; nothing when it must be imported.
  [[nodiscard]] std::optional<KeyInUse> imported_key(const PackedKey& packed) const;

  // ---- fetches ------------------------------------------------------------------------

  /// Where a fetch puts the bytes: given the object's size, the span to fill
  /// (a fresh one on each call), and the registered region it lies in (null:
  /// register it per transfer; after a failed transfer `keep_until` takes
  /// the span's memory over, to free it once the event resolves).
  struct Destination {
    std::function<Result<std::span<std::byte>>(std::uint64_t size)> span_for;
    RegionGuard* registered = nullptr;
    /// Where in `registered` the span begins.
    std::uint64_t registered_offset = 0;
    std::function<void(DeregisteredEvent)> keep_until;
    /// When set, chunks go here as they arrive instead of into span_for's
    /// memory (which then only serves an RDMA get, handed over whole).
    rendezvous::Sink sink;
    /// With a sink: span_for's memory is where an RDMA read belongs for
    /// good (the caller's landing), so the sink is not handed it.
    bool rdma_lands_for_good = false;
    /// With a sink: a chunked fetch (not a fallback) is read into
    /// span_for's memory as well, the sink not called.
    bool chunks_to_memory = false;
  };

  /// One object (or `range` of it), RDMA first and chunked exactly once on
  /// its failure.
  Awaitable<Result<FetchOutcome>> fetch(std::string name, const Destination& destination, ByteRange range = {});
  /// Many objects into slots of registered regions (fetch_many.cpp).
  Awaitable<ManyFetched> fetch_many(std::vector<std::string> names, std::vector<FetchSlot> slots);

  /// The hello (after the owner's proof, with a cluster key).
  Awaitable<Result<void>> hello();
  /// Asks the owner to prove it holds the cluster key (and is the expected
  /// owner): `not_owned` when it does not.
  Awaitable<Result<void>> prove_owner();

  // ---- push (consumer_push.cpp) ----------------------------------------------------

  /// One object written by the owner into `landing` at `options.offset`,
  /// read the ordinary way when the owner does not push it.
  Awaitable<Result<FetchOutcome>> push_fetch(std::string name, RegionGuard& landing, PushOptions options);
  /// The push peer, set up on the first call (concurrent callers wait for it).
  Awaitable<Result<PeerId>> push_peer_ready();

 private:
  /// Checks the answer to a pull of [offset, offset + len) of `job` and
  /// puts its bytes where they go (unless they landed there already).
  /// Wrong bytes end the connection: the owner is not speaking the protocol.
  /// A chunk for an asynchronous sink is handed to it through `handed`.
  Result<void> take_chunk(std::uint64_t offset, std::uint32_t len, Result<Message> reply, const PullJob& job,
                          std::size_t index, rendezvous::HandedOver& handed);
  /// Where the object goes; when it has nowhere to go, the lease is released.
  Awaitable<Result<std::span<std::byte>>> span_to_fill(const Destination& destination, std::uint64_t lease,
                                                       std::uint64_t size);
};

/// A fetch into `capacity` bytes at `offset` of a region the caller keeps
/// registered (refused when it is not, or when the object does not fit).
[[nodiscard]] Consumer::State::Destination registered_destination(RegionGuard& region, std::uint64_t offset,
                                                                  std::uint64_t capacity);

}  // namespace corma
