// The leases an owner has granted, by id and by connection, and the places
// its acquires under way hold against the lease caps. Every count the caps
// and the windows' shares read is kept here, next to the leases it counts,
// so no caller keeps one in step by hand. Used on the owner's executor alone.
#pragma once

#include <corma/owner.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace corma::rendezvous {

using clock_type = std::chrono::steady_clock;

struct Export;

struct Lease {
  std::uint64_t session = 0;
  std::string name;
  PublishedObject object;
  /// For published objects: the publication this lease reads. A release after
  /// the name was published again answers `object_changed`.
  std::optional<std::uint64_t> publication;
  /// Which version of the object the lease reads (told to version 5
  /// consumers): its publication, or the number given to the version the
  /// resolver found (Publications::resolved_generation).
  std::uint64_t generation = 0;
  std::shared_ptr<Export> exported;  // empty for chunked leases; the current window for windowed ones
  clock_type::time_point deadline;
  /// Lent in windows (protocol version 2): `exported` registers
  /// [window_end - its length, window_end) of the object.
  bool windowed = false;
  std::uint64_t window_end = 0;
  /// A next_window is registering this lease's next window now.
  bool moving = false;
};

class LeaseTable {
 public:
  /// Leases live `timeout` past their grant and each renewal.
  explicit LeaseTable(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  /// Records `lease` under a new id, which it returns, renewed now.
  std::uint64_t add(Lease lease);
  /// Lease `id` when `session` holds it; null otherwise (a lease of another
  /// connection is as unknown as one never granted).
  [[nodiscard]] Lease* held(std::uint64_t session, std::uint64_t id);
  /// Ends lease `id`, if it is there.
  void erase(std::uint64_t id);
  /// Ends every lease of `session` (its connection went).
  void drop_session(std::uint64_t session);
  /// Ends every lease whose deadline passed before `now`; how many.
  std::size_t expire(clock_type::time_point now);
  /// Ends every lease, each handed to `last` first (Owner::stop keeps their
  /// registrations until the owner goes).
  void clear(const std::function<void(Lease&)>& last);

  /// `lease` lives `timeout` from now.
  void renew(Lease& lease) const { lease.deadline = clock_type::now() + timeout_; }
  /// Renews every lease `session` holds; how many.
  std::uint32_t renew_all(std::uint64_t session);

  /// An acquire of `session` is under way (or ended): it holds a place
  /// against the lease caps meanwhile.
  void acquire_began(std::uint64_t session);
  void acquire_ended(std::uint64_t session);

  /// Leases alive.
  [[nodiscard]] std::size_t size() const noexcept { return leases_.size(); }
  /// Leases lent in windows: they share the budget.
  [[nodiscard]] std::size_t windowed() const noexcept { return windowed_; }
  /// Leases `session` holds and acquires it has under way.
  [[nodiscard]] std::size_t places_of(std::uint64_t session) const;
  /// The same over every connection.
  [[nodiscard]] std::size_t places() const noexcept { return leases_.size() + acquiring_total_; }

 private:
  using Leases = std::map<std::uint64_t, Lease>;
  Leases::iterator erase(Leases::iterator it);

  std::chrono::milliseconds timeout_;
  Leases leases_;
  /// The leases of each connection, so that counting and dropping them
  /// never scans every lease.
  std::unordered_map<std::uint64_t, std::unordered_set<std::uint64_t>> by_session_;
  std::unordered_map<std::uint64_t, std::size_t> acquiring_;
  std::size_t acquiring_total_ = 0;
  std::size_t windowed_ = 0;
  std::uint64_t next_id_ = 1;
};

}  // namespace corma::rendezvous
