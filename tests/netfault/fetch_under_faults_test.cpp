// `corma serve` in one namespace and `corma get` in another, as separate
// processes, across a faulty link: at round trips of 1, 5 and 20 ms, with
// loss of 0.1, 1 and 5 % and with reordering, every path (RDMA over UCX's
// tcp, whole or in windows; chunks with the default and the widest pull
// window) delivers the file byte for byte. Speeds are printed beside a plain TCP stream of the
// same bytes over the same link.
#include "netfault/faulted_fetch.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace corma::netfault {
namespace {

/// A link profile of the list, by the name the report gives it.
struct NamedProfile {
  const char* name;
  LinkProfile profile;
};

class EveryPathUnder : public FetchUnderFaults, public ::testing::WithParamInterface<NamedProfile> {};

TEST_P(EveryPathUnder, TheProfileAndArrivesByteExact) {
  link(GetParam().profile);
  make_file(16u << 20);
  serve({"--trusted-peers"});
  // An owner whose budget holds a quarter of the file lends it in windows.
  const auto windowed_owner = start_owner({"--trusted-peers", "--budget", "4M"});
  const auto rdma = fetch_whole("rdma.out", {"--trusted-peers"}, nullptr, "via rdma,");
  const auto windows = fetch_whole("windows.out", {"--trusted-peers"}, &windowed_owner, "via rdma in ");
  const auto chunked = fetch_whole("chunked.out", {}, nullptr, "via chunked");
  const auto wide = fetch_whole("wide.out", {"--pull-window", "64"}, nullptr, "via chunked");
  report(GetParam().name, {{"rdma", rdma}, {"rdma_windows", windows}, {"chunked", chunked}, {"chunked_window_64", wide}});
}

constexpr std::uint64_t gigabit = 1'000'000'000;
INSTANTIATE_TEST_SUITE_P(
    Profiles, EveryPathUnder,
    ::testing::Values(NamedProfile{"rtt_1ms", {500us, 0, 1000us, 0, gigabit}},
                      NamedProfile{"rtt_5ms", {2500us, 0, 1000us, 0, gigabit}},
                      NamedProfile{"rtt_20ms", {10000us, 0, 1000us, 0, gigabit}},
                      NamedProfile{"rtt_5ms_loss_0_1pct", {2500us, 0, 1000us, 1, gigabit}},
                      NamedProfile{"rtt_5ms_loss_1pct", {2500us, 0, 1000us, 10, gigabit}},
                      NamedProfile{"rtt_5ms_loss_5pct", {2500us, 0, 1000us, 50, gigabit}},
                      NamedProfile{"rtt_2ms_reorder_20pct", {1000us, 20, 1500us, 0, gigabit}}),
    [](const auto& named) { return std::string(named.param.name); });

}  // namespace
}  // namespace corma::netfault
