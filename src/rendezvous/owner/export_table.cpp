#include "rendezvous/owner/export_table.hpp"

#include <algorithm>

namespace corma::rendezvous {

std::shared_ptr<Export> ExportTable::ready(const std::string& name, const PublishedObject& object) const {
  if (auto it = current_.find(name); it != current_.end()) {
    if (auto shared = it->second.lock(); shared && shared->covers(object)) return shared;
  }
  return nullptr;
}

void ExportTable::record(const std::string& name, std::shared_ptr<Export> exported) {
  if (current_.size() >= 2 * std::max<std::size_t>(after_sweep_, 64)) {
    std::erase_if(current_, [](const auto& entry) { return entry.second.expired(); });
    after_sweep_ = current_.size();
  }
  current_[name] = std::move(exported);
}

ExportTable::Registering::Registering(ExportTable& table, std::string name)
    : table_(table),
      name_(std::move(name)),
      done_(std::make_shared<boost::asio::steady_timer>(table.executor_, boost::asio::steady_timer::time_point::max())) {
  table_.registering_.emplace(name_, done_);
}

ExportTable::Registering::~Registering() {
  table_.registering_.erase(name_);
  done_->cancel();
}

std::shared_ptr<boost::asio::steady_timer> ExportTable::waiter(const std::string& name) const {
  auto it = registering_.find(name);
  return it == registering_.end() ? nullptr : it->second;
}

std::function<void()> ExportTable::eviction_counter() const {
  return [evicted = evicted_] { evicted->fetch_add(1, std::memory_order_relaxed); };
}

}  // namespace corma::rendezvous
