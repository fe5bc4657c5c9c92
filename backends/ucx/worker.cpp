#include "worker.hpp"

#include "engine.hpp"

#include <unistd.h>

namespace corma::ucx {

Result<void> ProgressedWorker::open(ucp_context_h context, boost::asio::io_context& io) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (auto st = ucp_worker_create(context, &params, &handle_); st != UCS_OK) {
    handle_ = nullptr;
    return ucs_error(errc::not_configured, "ucp_worker_create", st);
  }
  int efd = -1;
  if (auto st = ucp_worker_get_efd(handle_, &efd); st != UCS_OK) {
    destroy();
    return ucs_error(errc::not_configured, "ucp_worker_get_efd", st);
  }
  wake_.emplace(io, ::dup(efd));  // asio closes its own copy
  return success();
}

std::size_t ProgressedWorker::progress() {
  std::size_t events = 0;
  if (handle_ == nullptr) return events;
  while (ucp_worker_progress(handle_) != 0) ++events;
  return events;
}

bool ProgressedWorker::arm_for_sleep() {
  if (handle_ == nullptr || !wake_) return true;
  if (ucp_worker_arm(handle_) == UCS_ERR_BUSY) return false;  // events pending: progress again
  if (!wake_armed_) {
    wake_armed_ = true;
    wake_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                      [this](boost::system::error_code) { wake_armed_ = false; });
  }
  return true;
}

int ProgressedWorker::arm_for_poll() {
  if (handle_ == nullptr || !wake_ || ucp_worker_arm(handle_) == UCS_ERR_BUSY) return -1;
  return wake_->native_handle();
}

void ProgressedWorker::close_wake() {
  if (!wake_) return;
  boost::system::error_code ignored;
  wake_->close(ignored);
  wake_.reset();
}

void ProgressedWorker::destroy() {
  close_wake();
  if (handle_ != nullptr) ucp_worker_destroy(handle_);
  handle_ = nullptr;
}

}  // namespace corma::ucx
