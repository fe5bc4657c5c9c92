#include "mailbox.hpp"

#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>

namespace corma::verbs {

Result<Mailbox> Mailbox::create(const IbvApi& api, ibv_pd* pd) {
  Mailbox box;
  box.bytes_.assign(std::size_t{receive_depth + send_slots} * slot_size, std::byte{0});
  errno = 0;
  // Local write: receives land here. Nothing remote ever names it.
  box.mr_ = own<OwnedMr>(api, api.reg_mr(pd, box.bytes_.data(), box.bytes_.size(), IBV_ACCESS_LOCAL_WRITE));
  if (box.mr_ == nullptr) {
    const int err = errno != 0 ? errno : EINVAL;
    return fail(errc::backend, std::string("verbs: ibv_reg_mr (a peer's message buffers): ") + std::strerror(err));
  }
  // Taken from the back: slot 0 first.
  box.free_notify_.resize(window);
  std::iota(box.free_notify_.rbegin(), box.free_notify_.rend(), std::uint32_t{0});
  box.free_ack_.resize(ack_slots);
  std::iota(box.free_ack_.rbegin(), box.free_ack_.rend(), window);
  return box;
}

ibv_sge Mailbox::receive_sge(std::uint32_t slot) const {
  return ibv_sge{reinterpret_cast<std::uint64_t>(bytes_.data() + std::size_t{slot} * slot_size), slot_size, mr_->lkey};
}

std::optional<std::span<const std::byte>> Mailbox::received(std::uint32_t slot, std::uint32_t len) const {
  if (slot >= receive_depth || len > slot_size) return std::nullopt;
  return std::span<const std::byte>(bytes_).subspan(std::size_t{slot} * slot_size, len);
}

std::uint32_t Mailbox::take_notify_slot() {
  const std::uint32_t slot = free_notify_.back();
  free_notify_.pop_back();
  return slot;
}

std::optional<std::uint32_t> Mailbox::take_ack_slot() {
  if (free_ack_.empty()) return std::nullopt;
  const std::uint32_t slot = free_ack_.back();
  free_ack_.pop_back();
  return slot;
}

void Mailbox::give_back(std::uint32_t send_slot) {
  (send_slot < window ? free_notify_ : free_ack_).push_back(send_slot);
}

ibv_sge Mailbox::fill(std::uint32_t send_slot, std::span<const std::byte> bytes) {
  std::byte* at = bytes_.data() + (std::size_t{receive_depth} + send_slot) * slot_size;
  std::memcpy(at, bytes.data(), bytes.size());
  return ibv_sge{reinterpret_cast<std::uint64_t>(at), static_cast<std::uint32_t>(bytes.size()), mr_->lkey};
}

}  // namespace corma::verbs
