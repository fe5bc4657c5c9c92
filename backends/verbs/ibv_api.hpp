// The verbs backend's only way to reach a provider: a table of the libibverbs
// entry points it uses. The table is filled either by dlopen("libibverbs.so.1")
// (load_libibverbs), so binaries run on hosts without rdma-core's runtime, or
// by an in-process software provider in the tests. Every call the backend
// makes goes through it, so a test provider sees (and checks) all of them.
//
// Each pointer has the signature of the libibverbs function of the same name.
// Those that verbs.h implements inline through the device's ops
// (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq, ibv_query_port) are
// reached through small wrappers on the dlopen path.
#pragma once

#include <corma/error.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace corma::verbs {

struct IbvApi {
  /// Where the table came from, for messages: "libibverbs.so.1", "soft".
  std::string origin;

  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  /// Fills the whole ibv_port_attr (zeroing what the provider does not set).
  int (*query_port)(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid) = nullptr;
  /// libibverbs' _ibv_query_gid_ex; may be null (old rdma-core): then no
  /// RoCE v2 auto-selection, and the configured (or first) GID index is used.
  int (*query_gid_ex)(ibv_context* context, std::uint32_t port, std::uint32_t index, ibv_gid_entry* entry,
                      std::uint32_t flags, std::size_t entry_size) = nullptr;

  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, std::size_t length, int access) = nullptr;
  /// May be null (old rdma-core): relaxed ordering is then not available.
  ibv_mr* (*reg_mr_iova2)(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova,
                          unsigned int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;

  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc) = nullptr;

  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = nullptr;

  /// Reads context->async_fd; the backend makes that fd non-blocking.
  int (*get_async_event)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ack_async_event)(ibv_async_event* event) = nullptr;

  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;
  const char* (*event_type_str)(ibv_event_type event) = nullptr;
};

/// Loads libibverbs.so.1 and fills a table from it. `not_configured` when the
/// library or one of the required symbols is missing (the detail says which).
[[nodiscard]] Result<std::shared_ptr<const IbvApi>> load_libibverbs();

/// Null when every required entry is filled, otherwise the first missing name.
[[nodiscard]] const char* first_missing_entry(const IbvApi& api) noexcept;

}  // namespace corma::verbs
