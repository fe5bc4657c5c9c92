// The transfers a progress thread has admitted and not yet finished, in a
// flat array of slots: inserting, finding and removing cost no allocation
// once the table has grown to the number in flight (a tree node per transfer
// did). An id names a slot and that slot's use, so an id that outlived its
// transfer (a late provider completion, a stranded request) finds nothing
// rather than the slot's next occupant.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace corma::backend_kit {

template <class Op>
class TransferTable {
 public:
  /// Stores `op`; the id is never 0 (0 means "not admitted").
  std::uint64_t insert(std::shared_ptr<Op> op) {
    std::uint32_t index;
    if (free_.empty()) {
      index = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    } else {
      index = free_.back();
      free_.pop_back();
    }
    Slot& slot = slots_[index];
    slot.op = std::move(op);
    ++size_;
    return id_of(index, slot.use);
  }

  /// The transfer under `id`, or null.
  [[nodiscard]] Op* find(std::uint64_t id) const {
    const Slot* slot = slot_of(id);
    return slot != nullptr ? slot->op.get() : nullptr;
  }
  /// The same, sharing ownership (for keeping it past its removal).
  [[nodiscard]] std::shared_ptr<Op> share(std::uint64_t id) const {
    const Slot* slot = slot_of(id);
    return slot != nullptr ? slot->op : nullptr;
  }

  /// Removes and returns the transfer under `id`; null when unknown.
  std::shared_ptr<Op> take(std::uint64_t id) {
    Slot* slot = slot_of(id);
    if (slot == nullptr) return nullptr;
    auto op = std::move(slot->op);
    if (++slot->use == 0) slot->use = 1;  // the old id no longer matches; no id is 0
    free_.push_back(static_cast<std::uint32_t>(slot - slots_.data()));
    --size_;
    return op;
  }

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// Calls `f(id, op)` for every transfer; `f` must not change the table.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].op) f(id_of(static_cast<std::uint32_t>(i), slots_[i].use), slots_[i].op);
    }
  }

  /// The ids of the transfers `pred(op)` holds for, to change them after.
  template <class Pred>
  [[nodiscard]] std::vector<std::uint64_t> ids_where(Pred&& pred) const {
    std::vector<std::uint64_t> ids;
    for_each([&](std::uint64_t id, const std::shared_ptr<Op>& op) {
      if (pred(*op)) ids.push_back(id);
    });
    return ids;
  }

  void clear() {
    slots_.clear();
    free_.clear();
    size_ = 0;
  }

 private:
  struct Slot {
    std::shared_ptr<Op> op;
    std::uint32_t use = 1;  // starts at 1 so that no id is 0
  };

  static std::uint64_t id_of(std::uint32_t index, std::uint32_t use) {
    return (static_cast<std::uint64_t>(use) << 32) | index;
  }
  [[nodiscard]] const Slot* slot_of(std::uint64_t id) const {
    const auto index = static_cast<std::uint32_t>(id);
    if (index >= slots_.size()) return nullptr;
    const Slot& slot = slots_[index];
    return slot.op && slot.use == static_cast<std::uint32_t>(id >> 32) ? &slot : nullptr;
  }
  Slot* slot_of(std::uint64_t id) { return const_cast<Slot*>(std::as_const(*this).slot_of(id)); }

  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
  std::size_t size_ = 0;
};

}  // namespace corma::backend_kit
