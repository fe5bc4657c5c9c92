// Fills an IbvApi from libibverbs.so.1 at run time. Nothing here links
// against libibverbs: the inline helpers of verbs.h used below only follow
// the device's own ops table, and every exported function is looked up with
// dlsym.
#include "ibv_api.hpp"

#include <dlfcn.h>

#include <cstring>
#include <string>

namespace corma::verbs {
namespace {

constexpr const char* library_name = "libibverbs.so.1";

// libibverbs exports ibv_query_port with the old, shorter attribute layout;
// the wrapper below zeroes the whole struct first, as verbs.h's inline does.
using CompatQueryPort = int (*)(ibv_context*, std::uint8_t, ibv_port_attr*);
CompatQueryPort g_compat_query_port = nullptr;

int query_port_wrapper(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof *attr);
  return g_compat_query_port(context, port, attr);
}
int post_send_wrapper(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) { return ibv_post_send(qp, wr, bad_wr); }
int poll_cq_wrapper(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }
int req_notify_wrapper(ibv_cq* cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }

template <class Fn>
bool bind(void* library, Fn& slot, const char* name) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  return slot != nullptr;
}

}  // namespace

const char* first_missing_entry(const IbvApi& api) noexcept {
#define CORMA_REQUIRE_ENTRY(name) \
  if (api.name == nullptr) return #name;
  CORMA_REQUIRE_ENTRY(get_device_list)
  CORMA_REQUIRE_ENTRY(free_device_list)
  CORMA_REQUIRE_ENTRY(get_device_name)
  CORMA_REQUIRE_ENTRY(open_device)
  CORMA_REQUIRE_ENTRY(close_device)
  CORMA_REQUIRE_ENTRY(query_device)
  CORMA_REQUIRE_ENTRY(query_port)
  CORMA_REQUIRE_ENTRY(query_gid)
  CORMA_REQUIRE_ENTRY(alloc_pd)
  CORMA_REQUIRE_ENTRY(dealloc_pd)
  CORMA_REQUIRE_ENTRY(reg_mr)
  CORMA_REQUIRE_ENTRY(dereg_mr)
  CORMA_REQUIRE_ENTRY(create_comp_channel)
  CORMA_REQUIRE_ENTRY(destroy_comp_channel)
  CORMA_REQUIRE_ENTRY(create_cq)
  CORMA_REQUIRE_ENTRY(destroy_cq)
  CORMA_REQUIRE_ENTRY(req_notify_cq)
  CORMA_REQUIRE_ENTRY(get_cq_event)
  CORMA_REQUIRE_ENTRY(ack_cq_events)
  CORMA_REQUIRE_ENTRY(poll_cq)
  CORMA_REQUIRE_ENTRY(create_qp)
  CORMA_REQUIRE_ENTRY(modify_qp)
  CORMA_REQUIRE_ENTRY(destroy_qp)
  CORMA_REQUIRE_ENTRY(post_send)
  CORMA_REQUIRE_ENTRY(get_async_event)
  CORMA_REQUIRE_ENTRY(ack_async_event)
  CORMA_REQUIRE_ENTRY(wc_status_str)
  CORMA_REQUIRE_ENTRY(event_type_str)
#undef CORMA_REQUIRE_ENTRY
  return nullptr;
}

Result<std::shared_ptr<const IbvApi>> load_libibverbs() {
  // Never closed: providers loaded by libibverbs keep threads and state that
  // must not outlive their code.
  void* library = ::dlopen(library_name, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return fail(errc::not_configured,
                std::string("rdma-core's runtime is not installed: ") + (why != nullptr ? why : library_name));
  }
  auto api = std::make_shared<IbvApi>();
  api->origin = library_name;
  bind(library, api->get_device_list, "ibv_get_device_list");
  bind(library, api->free_device_list, "ibv_free_device_list");
  bind(library, api->get_device_name, "ibv_get_device_name");
  bind(library, api->open_device, "ibv_open_device");
  bind(library, api->close_device, "ibv_close_device");
  bind(library, api->query_device, "ibv_query_device");
  bind(library, api->query_gid, "ibv_query_gid");
  bind(library, api->query_gid_ex, "_ibv_query_gid_ex");  // optional
  bind(library, api->alloc_pd, "ibv_alloc_pd");
  bind(library, api->dealloc_pd, "ibv_dealloc_pd");
  bind(library, api->reg_mr, "ibv_reg_mr");
  bind(library, api->reg_mr_iova2, "ibv_reg_mr_iova2");  // optional
  bind(library, api->dereg_mr, "ibv_dereg_mr");
  bind(library, api->create_comp_channel, "ibv_create_comp_channel");
  bind(library, api->destroy_comp_channel, "ibv_destroy_comp_channel");
  bind(library, api->create_cq, "ibv_create_cq");
  bind(library, api->destroy_cq, "ibv_destroy_cq");
  bind(library, api->get_cq_event, "ibv_get_cq_event");
  bind(library, api->ack_cq_events, "ibv_ack_cq_events");
  bind(library, api->create_qp, "ibv_create_qp");
  bind(library, api->modify_qp, "ibv_modify_qp");
  bind(library, api->destroy_qp, "ibv_destroy_qp");
  bind(library, api->get_async_event, "ibv_get_async_event");
  bind(library, api->ack_async_event, "ibv_ack_async_event");
  bind(library, api->wc_status_str, "ibv_wc_status_str");
  bind(library, api->event_type_str, "ibv_event_type_str");
  if (bind(library, g_compat_query_port, "ibv_query_port")) api->query_port = &query_port_wrapper;
  api->post_send = &post_send_wrapper;
  api->poll_cq = &poll_cq_wrapper;
  api->req_notify_cq = &req_notify_wrapper;
  if (const char* missing = first_missing_entry(*api)) {
    return fail(errc::not_configured, std::string(library_name) + " lacks " + missing);
  }
  return std::shared_ptr<const IbvApi>(std::move(api));
}

}  // namespace corma::verbs
