// The verbs backend's only way to reach a provider: a table of the libibverbs
// entry points it uses. The table is filled either by dlopen("libibverbs.so.1")
// (load_libibverbs), so binaries run on hosts without rdma-core's runtime, or
// by an in-process software provider in the tests. Every call the backend
// makes goes through it, so a test provider sees (and checks) all of them.
//
// Each pointer has the signature of the libibverbs function of the same name.
// Those that verbs.h implements inline through the device's ops
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq,
// ibv_query_port) are
// reached through small wrappers on the dlopen path.
#pragma once

#include <corma/error.hpp>

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

// The table's single list: the struct members, the loader's dlsym calls and
// the required-entry check are all generated from it, so an entry point is
// added in one place. Kept in one list (not one per kind) so member order and
// the order first_missing_entry reports in stay as written. Three kinds:
//   REQUIRED(name)         libibverbs exports ibv_<name>; type from its
//                          prototype; the table is unusable without it.
//   OPTIONAL(name, symbol) exported as `symbol` only by newer rdma-core; type
//                          from its prototype; may stay null.
//   WRAPPED(name, type)    not dlsym-able with this signature (verbs.h inlines
//                          it, or exports an older layout); required, and the
//                          loader installs a wrapper (wrap_<name>) instead.
// Types come from the prototypes so a mismatch with verbs.h cannot creep in.
// (`&::ibv_reg_mr` is not followed by `(`, so verbs.h's function-like macro
// of that name does not expand there.)
#define CORMA_IBV_FUNCTIONS(REQUIRED, OPTIONAL, WRAPPED)                                  \
  REQUIRED(get_device_list)                                                               \
  REQUIRED(free_device_list)                                                              \
  REQUIRED(get_device_name)                                                               \
  REQUIRED(open_device)                                                                   \
  REQUIRED(close_device)                                                                  \
  REQUIRED(query_device)                                                                  \
  /* Fills the whole ibv_port_attr (zeroing what the provider does not set). */           \
  WRAPPED(query_port, int (*)(ibv_context*, std::uint8_t, ibv_port_attr*))                \
  REQUIRED(query_gid)                                                                     \
  /* Null on old rdma-core: then no RoCE v2 auto-selection, and the configured */         \
  /* (or first) GID index is used. */                                                     \
  OPTIONAL(query_gid_ex, _ibv_query_gid_ex)                                               \
                                                                                          \
  REQUIRED(alloc_pd)                                                                      \
  REQUIRED(dealloc_pd)                                                                    \
  REQUIRED(reg_mr)                                                                        \
  /* Null on old rdma-core: relaxed ordering is then not available. */                    \
  OPTIONAL(reg_mr_iova2, ibv_reg_mr_iova2)                                                \
  REQUIRED(dereg_mr)                                                                      \
                                                                                          \
  REQUIRED(create_comp_channel)                                                           \
  REQUIRED(destroy_comp_channel)                                                          \
  REQUIRED(create_cq)                                                                     \
  REQUIRED(destroy_cq)                                                                    \
  WRAPPED(req_notify_cq, decltype(&::ibv_req_notify_cq))                                  \
  REQUIRED(get_cq_event)                                                                  \
  REQUIRED(ack_cq_events)                                                                 \
  WRAPPED(poll_cq, decltype(&::ibv_poll_cq))                                              \
                                                                                          \
  REQUIRED(create_qp)                                                                     \
  REQUIRED(modify_qp)                                                                     \
  REQUIRED(destroy_qp)                                                                    \
  WRAPPED(post_send, decltype(&::ibv_post_send))                                          \
  /* The receive queue notifications and their acknowledgements land in. */             \
  WRAPPED(post_recv, decltype(&::ibv_post_recv))                                          \
                                                                                          \
  /* Reads context->async_fd; the backend makes that fd non-blocking. */                  \
  REQUIRED(get_async_event)                                                               \
  REQUIRED(ack_async_event)                                                               \
                                                                                          \
  REQUIRED(wc_status_str)                                                                 \
  REQUIRED(event_type_str)

namespace corma::verbs {

struct IbvApi {
  /// Where the table came from, for messages: "libibverbs.so.1", "soft".
  std::string origin;

  // A plain struct of pointers, so a software provider can fill it with its
  // own functions. type_identity_t lets a spelled-out pointer type precede
  // the member name.
#define CORMA_IBV_MEMBER_REQUIRED(name) decltype(&::ibv_##name) name = nullptr;
#define CORMA_IBV_MEMBER_OPTIONAL(name, symbol) decltype(&::symbol) name = nullptr;
#define CORMA_IBV_MEMBER_WRAPPED(name, type) std::type_identity_t<type> name = nullptr;
  CORMA_IBV_FUNCTIONS(CORMA_IBV_MEMBER_REQUIRED, CORMA_IBV_MEMBER_OPTIONAL, CORMA_IBV_MEMBER_WRAPPED)
#undef CORMA_IBV_MEMBER_REQUIRED
#undef CORMA_IBV_MEMBER_OPTIONAL
#undef CORMA_IBV_MEMBER_WRAPPED
};

/// Loads libibverbs.so.1 and fills a table from it. `not_configured` when the
/// library or one of the required symbols is missing (the detail says which).
[[nodiscard]] Result<std::shared_ptr<const IbvApi>> load_libibverbs();

/// Null when every required entry is filled, otherwise the first missing name.
[[nodiscard]] const char* first_missing_entry(const IbvApi& api) noexcept;

}  // namespace corma::verbs
