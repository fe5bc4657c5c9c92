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

template <class Fn>
bool bind(void* library, Fn& slot, const char* name) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  return slot != nullptr;
}

// libibverbs exports ibv_query_port with the old, shorter attribute layout;
// the wrapper below zeroes the whole struct first, as verbs.h's inline does.
using CompatQueryPort = int (*)(ibv_context*, std::uint8_t, ibv_port_attr*);
CompatQueryPort g_compat_query_port = nullptr;

int query_port_wrapper(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof *attr);
  return g_compat_query_port(context, port, attr);
}
int post_send_wrapper(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) { return ibv_post_send(qp, wr, bad_wr); }
int post_recv_wrapper(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) { return ibv_post_recv(qp, wr, bad_wr); }
int poll_cq_wrapper(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }
int req_notify_wrapper(ibv_cq* cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }

// One per WRAPPED entry of CORMA_IBV_FUNCTIONS, named wrap_<member>, so a new
// wrapped entry without a wrapper does not compile. Each returns what goes in
// the member: null when the library lacks what the wrapper forwards to.
decltype(IbvApi::query_port) wrap_query_port(void* library) {
  return bind(library, g_compat_query_port, "ibv_query_port") ? &query_port_wrapper : nullptr;
}
decltype(IbvApi::req_notify_cq) wrap_req_notify_cq(void* /*library*/) { return &req_notify_wrapper; }
decltype(IbvApi::poll_cq) wrap_poll_cq(void* /*library*/) { return &poll_cq_wrapper; }
decltype(IbvApi::post_send) wrap_post_send(void* /*library*/) { return &post_send_wrapper; }
decltype(IbvApi::post_recv) wrap_post_recv(void* /*library*/) { return &post_recv_wrapper; }

}  // namespace

const char* first_missing_entry(const IbvApi& api) noexcept {
  // Optional entries may be null; the rest are required, wrapped ones too.
#define CORMA_REQUIRE_ENTRY(name, ...) \
  if (api.name == nullptr) return #name;
#define CORMA_SKIP_ENTRY(name, symbol)
  CORMA_IBV_FUNCTIONS(CORMA_REQUIRE_ENTRY, CORMA_SKIP_ENTRY, CORMA_REQUIRE_ENTRY)
#undef CORMA_REQUIRE_ENTRY
#undef CORMA_SKIP_ENTRY
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
  // Misses are left null here and reported (required ones only) by
  // first_missing_entry below.
#define CORMA_BIND_REQUIRED(name) bind(library, api->name, "ibv_" #name);
#define CORMA_BIND_OPTIONAL(name, symbol) bind(library, api->name, #symbol);
#define CORMA_BIND_WRAPPED(name, type) api->name = wrap_##name(library);
  CORMA_IBV_FUNCTIONS(CORMA_BIND_REQUIRED, CORMA_BIND_OPTIONAL, CORMA_BIND_WRAPPED)
#undef CORMA_BIND_REQUIRED
#undef CORMA_BIND_OPTIONAL
#undef CORMA_BIND_WRAPPED
  if (const char* missing = first_missing_entry(*api)) {
    return fail(errc::not_configured, std::string(library_name) + " lacks " + missing);
  }
  return std::shared_ptr<const IbvApi>(std::move(api));
}

}  // namespace corma::verbs
