#include "programs/mix_backends.hpp"

#include "support/test_backend.hpp"

#if CORMA_PROGRAMS_WITH_UCX
#include <corma/ucx.hpp>
#endif
#if CORMA_PROGRAMS_WITH_VERBS
#include "provider_table.hpp"
#include "support/soft_verbs.hpp"

#include <corma/verbs.hpp>

#include <cstdlib>
#endif

namespace corma::programs {
namespace {

using namespace std::chrono_literals;

template <class T>
std::shared_ptr<RdmaBackend> created(Result<std::shared_ptr<T>> backend, const char* what) {
  if (!backend) fail_run(std::string(what) + ": " + backend.error().message());
  return std::move(backend).value();
}

}  // namespace

BackendPair make_pair(const std::string& name, std::string& unavailable) {
  BackendPair pair;
  if (name == "test") {
    pair.initiator = testing::TestBackend::create();
    pair.target = testing::TestBackend::create();
  }
#if CORMA_PROGRAMS_WITH_UCX
  if (name == "ucx-tcp" || name == "ucx-shm") {
    ucx::Config config;
    if (name == "ucx-tcp") {
      config.transport = ucx::Transport::tcp;
      config.trusted_peers = true;
      config.tcp_interface = "lo";
    } else {
      config.transport = ucx::Transport::shared_memory;
      config.error_handling = ucx::ErrorHandling::none;
    }
    config.operation_timeout = 5s;
    config.shutdown_timeout = 2s;
    pair.initiator = created(ucx::Backend::create(config), "UCX backend");
    pair.target = created(ucx::Backend::create(config), "UCX backend");
  }
#endif
#if CORMA_PROGRAMS_WITH_VERBS
  if (name == "verbs-soft") {
    auto& fabric = testing::SoftVerbs::instance();
    verbs::Config config;
    config.operation_timeout = 5s;
    config.shutdown_timeout = 2s;
    pair.initiator = created(verbs::create_over(config, fabric.api()), "verbs backend");
    pair.target = created(verbs::create_over(config, fabric.api()), "verbs backend");
  }
  if (name == "verbs-device") {
    verbs::Config config;
    config.operation_timeout = 5s;
    config.shutdown_timeout = 2s;
    if (const char* device = std::getenv("CORMA_VERBS_DEVICE")) config.device = device;
    if (const char* gid = std::getenv("CORMA_VERBS_GID_INDEX")) config.gid_index = std::atoi(gid);
    auto first = verbs::Backend::create(config);
    if (!first) {
      unavailable = "no usable RDMA device here: " + first.error().message();
      return pair;
    }
    pair.initiator = std::move(first).value();
    pair.target = created(verbs::Backend::create(config), "verbs backend");
  }
#endif
  if (!pair.initiator) {
    unavailable = "no backend named '" + name + "' in this build";
    return pair;
  }
  connect(pair);
  return pair;
}

}  // namespace corma::programs
