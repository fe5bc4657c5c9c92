// The software verbs provider behind SoftVerbs (see soft_verbs.hpp).
//
// One process-wide Fabric holds every object under one mutex. Objects derive
// from the libibverbs structs the caller sees; every entry point looks the
// handle up among the live objects before touching it, so a stale or foreign
// handle is reported (misuses()) instead of dereferenced. Recently destroyed
// objects stay allocated, so a new object does not reuse the address of a
// destroyed one and a stale handle cannot pass for a live one.
//
// reset() starts a new generation: objects left from earlier ones stay valid
// (a backend still shutting down can finish) but stop counting, and their QPs
// are put in the error state so that they never touch memory again.
//
// Work requests execute on one worker thread, in post order, with validation
// and the memory copy (or the atomic) done under the fabric mutex: a copy can
// never race the deregistration of its MR or the destruction of its QP, and an
// atomic never races a copy of the same bytes.
#include "soft_verbs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace corma::testing {

std::vector<std::pair<ibv_gid, ibv_gid_type>> default_soft_gids() {
  ibv_gid gid{};
  gid.raw[0] = 0xfe;
  gid.raw[1] = 0x80;
  const std::uint8_t interface_id[8] = {0x02, 0x50, 0x53, 0xff, 0xfe, 0x00, 0x00, 0x01};
  std::memcpy(gid.raw + 8, interface_id, sizeof interface_id);
  return {{gid, IBV_GID_TYPE_IB}};
}

namespace {

using Clock = std::chrono::steady_clock;
using Lock = std::unique_lock<std::mutex>;

constexpr std::uint8_t kPort = 1;
constexpr int kMaxSge = 1;
constexpr int kMaxRdAtomic = 16;
constexpr ibv_mtu kMtu = IBV_MTU_4096;
constexpr std::uint32_t k24Bits = 0xffffff;
// Destroyed objects kept allocated (so their addresses are not reused while a
// stale handle may still name them); older ones are freed.
constexpr std::size_t kTombSize = 1 << 16;

// ===========================================================================
// Doorbell: the readable fd behind a completion channel or a context's
// async_fd. At most one byte sits in the pipe, present while events wait, so
// writes never block, and events discarded with their CQ or QP leave at worst
// one stale byte (the reader then finds no event and reads again).
// ===========================================================================

class Doorbell {
 public:
  bool open() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    // The caller may make the read end non-blocking; the write end is ours.
    ::fcntl(write_fd_, F_SETFL, O_NONBLOCK);
    struct stat st {};
    ::fstat(read_fd_, &st);
    pipe_ = {st.st_dev, st.st_ino};
    return true;
  }
  /// Closes both ends. False when the caller had already closed the read end
  /// (the fd is gone, or its number now names another file): that one is
  /// left alone, as closing it would close someone else's file.
  bool close() {
    const bool intact = is_ours(read_fd_);
    if (intact) ::close(read_fd_);
    ::close(write_fd_);
    read_fd_ = write_fd_ = -1;
    return intact;
  }
  [[nodiscard]] int read_fd() const { return read_fd_; }

  void ring() {
    if (rung_) return;
    const char byte = 1;
    rung_ = ::write(write_fd_, &byte, 1) == 1;
  }
  /// The reader took the byte: the next event must ring again.
  void taken() { rung_ = false; }

 private:
  [[nodiscard]] bool is_ours(int fd) const {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && st.st_dev == pipe_.first && st.st_ino == pipe_.second;
  }

  int read_fd_ = -1;
  int write_fd_ = -1;
  bool rung_ = false;
  std::pair<dev_t, ino_t> pipe_{};
};

/// Blocks (or not, per the fd's O_NONBLOCK) for the doorbell's byte, the way
/// libibverbs reads its event fds. False with errno set when nothing was read.
bool take_doorbell_byte(int fd) {
  for (;;) {
    char byte = 0;
    const ssize_t n = ::read(fd, &byte, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EBADF;  // the write end closed: the owner was destroyed
    return false;
  }
}

// ===========================================================================
// Objects. Each derives from the struct the caller sees, value-initialised.
// ===========================================================================

struct SoftCq;

struct SoftDevice : ibv_device {};

/// What every object records: the reset() generation it was created in.
struct Tracked {
  std::uint64_t generation = 0;
};

struct SoftContext : ibv_context, Tracked {
  Doorbell doorbell;
  std::deque<ibv_async_event> events;
  std::uint16_t lid = 0;
  std::size_t pds = 0, cqs = 0, channels = 0;
  std::size_t async_read = 0, async_acked = 0;
};

struct SoftPd : ibv_pd, Tracked {
  std::size_t mrs = 0, qps = 0;
};

struct SoftMr : ibv_mr, Tracked {
  int access = 0;
  std::uint64_t iova = 0;  // the address work requests name; equals addr for reg_mr
};

struct SoftChannel : ibv_comp_channel, Tracked {
  Doorbell doorbell;
  std::deque<SoftCq*> events;  // CQs whose completion event waits to be read
  std::size_t cqs = 0;
};

/// A completion plus the send-queue position it frees once polled.
struct Cqe {
  ibv_wc wc;
  std::uint64_t seq;
};

struct SoftCq : ibv_cq, Tracked {
  std::deque<Cqe> entries;
  bool armed = false;
  std::size_t qps = 0;
  std::size_t events_read = 0, events_acked = 0;
  std::size_t async_read = 0, async_acked = 0;
};

/// A posted receive: where the next SEND (its bytes) or RDMA WRITE with
/// immediate (only its completion) lands.
struct Receive {
  std::uint64_t wr_id = 0;
  std::uint64_t addr = 0;
  std::uint32_t lkey = 0;
  std::uint32_t length = 0;  // 0 with no scatter/gather entry
};

struct SoftQp : ibv_qp, Tracked {
  // The real state. ibv_qp::state, like libibverbs', only follows modify_qp:
  // an error completion or a fatal event does not change it.
  ibv_qp_state actual = IBV_QPS_RESET;
  ibv_qp_cap cap{};
  bool signal_all = false;
  // Connection, recorded by modify_qp.
  int access = 0;
  std::uint32_t dest_qpn = 0, rq_psn = 0, sq_psn = 0;
  std::uint16_t dlid = 0;
  int max_rd_atomic = 0, max_dest_rd_atomic = 0;
  std::uint8_t timeout = 0, retry_cnt = 0;
  std::uint8_t rnr_retry = 0;      // as requester: RNR NAKs it sits out (7: forever)
  std::uint8_t min_rnr_timer = 0;  // as responder: the wait its RNR NAKs ask for
  // Receive queue, consumed in post order by the peer's SENDs and RDMA
  // WRITEs with immediate; at most cap.max_recv_wr.
  std::deque<Receive> receives;
  // Send queue: slots [released, posted) are occupied.
  std::uint64_t posted = 0, released = 0;
  std::size_t async_read = 0, async_acked = 0;

  [[nodiscard]] std::uint64_t occupied() const { return posted - released; }
};

/// An accepted work request, waiting for the worker.
struct Work {
  SoftQp* qp;
  std::uint64_t seq;
  std::uint64_t wr_id;
  ibv_wr_opcode opcode;
  bool signaled;
  std::uint64_t local_addr;
  std::uint32_t lkey;
  std::uint32_t length;
  std::uint64_t remote_addr;
  std::uint32_t rkey;
  std::uint64_t compare_add;  // atomics: the value added, or compared
  std::uint64_t swap;         // compare-and-swap: the value stored on a match
  std::uint32_t imm_data;     // *_WITH_IMM: handed to the receiver as it is (network order by convention)
  // Set when its responder first failed to answer: the end of its retries.
  std::optional<std::chrono::steady_clock::time_point> retry_until;
};

/// Live objects of one kind, by the handle the caller holds.
template <class Soft>
using Live = std::unordered_map<const void*, std::shared_ptr<Soft>>;

// ===========================================================================
// The fabric
// ===========================================================================

struct Fabric {
  std::mutex mu;
  std::condition_variable work_cv;  // the worker waits for work
  std::condition_variable changed;  // wait_until waits for progress
  SoftVerbsConfig config;

  std::deque<std::unique_ptr<SoftDevice>> devices;  // never freed: lists and contexts point at them
  std::unordered_set<ibv_device**> device_lists;
  Live<SoftContext> contexts;
  Live<SoftPd> pds;
  Live<SoftMr> mrs;
  Live<SoftChannel> channels;
  Live<SoftCq> cqs;
  Live<SoftQp> qps;
  std::unordered_map<std::uint32_t, SoftMr*> by_lkey, by_rkey;
  std::unordered_map<std::uint32_t, SoftQp*> by_qpn;
  std::deque<std::shared_ptr<void>> destroyed;  // the kTombSize most recently destroyed objects

  std::deque<Work> work;
  bool held = false;
  std::chrono::nanoseconds delay{0};
  std::uint64_t generation = 0;  // bumped by reset()

  int fail_reg_mr = 0;
  std::optional<ibv_wc_status> fail_completion;

  // Counters of the current generation.
  std::size_t posted = 0, post_calls = 0, overruns = 0, max_outstanding = 0, cq_overruns = 0, misuses = 0;
  std::size_t receives_posted = 0, rnr_naks = 0;
  std::string last_misuse;
  // Contexts that read a port or device event not yet acknowledged, by event
  // type, oldest first: such an acknowledgement names no object.
  std::unordered_map<int, std::deque<const void*>> unbound_events;

  // Identities are never reused, across resets too.
  std::uint32_t next_key = 1, next_handle = 1, next_qpn = 0x100;
  std::uint16_t next_lid = 1;

  Fabric() { std::thread([this] { run_worker(); }).detach(); }
  void run_worker();
};

Fabric& fabric() {
  static auto* instance = new Fabric;  // leaked: its detached worker runs until exit
  return *instance;
}

void misuse(Fabric& f, std::string what) {
  ++f.misuses;
  f.last_misuse = std::move(what);
}

/// The live object behind `handle`, or null (a misuse by `call`).
template <class Soft>
Soft* find(Fabric& f, const char* call, Live<Soft>& live, const void* handle) {
  const auto it = handle != nullptr ? live.find(handle) : live.end();
  if (it != live.end()) return it->second.get();
  char what[160];
  std::snprintf(what, sizeof what, "%s: %s handle %p", call, handle == nullptr ? "null" : "unknown or destroyed",
                handle);
  misuse(f, what);
  return nullptr;
}

/// The fabric with its lock held: entry points keep it for the whole call,
/// so that what they check cannot change before they act on it.
struct Held {
  Fabric& f;
  Lock lock;
};

Held lock_fabric() {
  Fabric& f = fabric();
  return {f, Lock(f.mu)};
}

/// The fabric with its lock held, and the live object behind `handle` (null
/// when there is none: the misuse is already counted, by `call`).
template <class Soft>
struct HeldWith {
  Fabric& f;
  Lock lock;
  Soft* object;
};

template <class Soft>
HeldWith<Soft> lock_and_find(const char* call, Live<Soft> Fabric::*live, const void* handle) {
  auto [f, lock] = lock_fabric();
  Soft* object = find(f, call, f.*live, handle);
  return {f, std::move(lock), object};
}

/// How libibverbs fails a call that returns a pointer: null, with errno set.
std::nullptr_t null_with_errno(int err) {
  errno = err;
  return nullptr;
}

/// How libibverbs fails a call that returns -1 on error: -1, with errno set.
int minus_one_with_errno(int err) {
  errno = err;
  return -1;
}

template <class Soft, class Base>
Soft* adopt(Fabric& f, Live<Soft>& live, std::shared_ptr<Soft> object) {
  Soft* raw = object.get();
  raw->generation = f.generation;
  live.emplace(static_cast<Base*>(raw), std::move(object));
  return raw;
}

template <class Soft>
std::size_t count_current(const Fabric& f, const Live<Soft>& live) {
  return static_cast<std::size_t>(std::count_if(
      live.begin(), live.end(), [&](const auto& entry) { return entry.second->generation == f.generation; }));
}

bool is_current(const Fabric& f, const Tracked& object) { return object.generation == f.generation; }

template <class Soft>
void retire(Fabric& f, Live<Soft>& live, const void* handle) {
  const auto it = live.find(handle);
  f.destroyed.push_back(std::move(it->second));
  live.erase(it);
  if (f.destroyed.size() > kTombSize) f.destroyed.pop_front();
}

SoftContext& context_of(Fabric& f, ibv_context* context) {
  return *f.contexts.at(context);
}

bool is_ethernet(const Fabric& f) { return f.config.link_layer == IBV_LINK_LAYER_ETHERNET; }

bool gid_is_empty(const ibv_gid& gid) {
  return std::all_of(std::begin(gid.raw), std::end(gid.raw), [](std::uint8_t b) { return b == 0; });
}

/// A populated GID slot of the port, or null.
const ibv_gid* populated_gid(const Fabric& f, std::size_t index) {
  if (index >= f.config.gids.size() || gid_is_empty(f.config.gids[index].first)) return nullptr;
  return &f.config.gids[index].first;
}

bool is_qp_event(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}

bool is_port_event(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      return true;
    default:
      return false;
  }
}

/// The QP or CQ an event is about; null for port and device events.
const void* event_object(const ibv_async_event& e) {
  if (is_qp_event(e.event_type)) return e.element.qp;
  if (e.event_type == IBV_EVENT_CQ_ERR) return e.element.cq;
  return nullptr;
}

void push_async_event(SoftContext& context, const ibv_async_event& event) {
  context.events.push_back(event);
  context.doorbell.ring();
}

/// Raises `type` about `qp` on the QP's own context.
void raise_qp_event(Fabric& f, SoftQp& qp, ibv_event_type type) {
  ibv_async_event event{};
  event.event_type = type;
  event.element.qp = &qp;
  push_async_event(context_of(f, qp.context), event);
}

/// The QP's send and receive CQs, as the provider's own objects.
SoftCq& send_cq_of(const SoftQp& qp) { return *static_cast<SoftCq*>(qp.send_cq); }
SoftCq& recv_cq_of(const SoftQp& qp) { return *static_cast<SoftCq*>(qp.recv_cq); }

// ===========================================================================
// Devices, contexts, queries
// ===========================================================================

ibv_device** sv_get_device_list(int* num_devices) {
  auto [f, lock] = lock_fabric();
  if (f.config.no_kernel_support) return null_with_errno(ENOSYS);
  const std::uint32_t count = f.config.device_count;
  while (f.devices.size() < count) {
    auto device = std::make_unique<SoftDevice>();
    const auto index = f.devices.size();
    device->node_type = IBV_NODE_CA;
    device->transport_type = IBV_TRANSPORT_IB;
    std::snprintf(device->name, sizeof device->name, "soft%zu", index);
    std::snprintf(device->dev_name, sizeof device->dev_name, "uverbs%zu", index);
    f.devices.push_back(std::move(device));
  }
  auto* list = new ibv_device*[count + 1];
  for (std::uint32_t i = 0; i < count; ++i) list[i] = f.devices[i].get();
  list[count] = nullptr;
  f.device_lists.insert(list);
  if (num_devices != nullptr) *num_devices = static_cast<int>(count);
  return list;
}

void sv_free_device_list(ibv_device** list) {
  auto [f, lock] = lock_fabric();
  if (f.device_lists.erase(list) == 0) {
    misuse(f, "ibv_free_device_list: a list not returned by ibv_get_device_list, or freed already");
    return;
  }
  delete[] list;
}

SoftDevice* find_device(Fabric& f, ibv_device* device) {
  for (auto& d : f.devices) {
    if (d.get() == device) return d.get();
  }
  misuse(f, "not a device of ibv_get_device_list");
  return nullptr;
}

const char* sv_get_device_name(ibv_device* device) {
  auto [f, lock] = lock_fabric();
  auto* d = find_device(f, device);
  if (d == nullptr) return null_with_errno(EINVAL);
  return d->name;
}

ibv_context* sv_open_device(ibv_device* device) {
  auto [f, lock] = lock_fabric();
  auto* d = find_device(f, device);
  if (d == nullptr) return null_with_errno(ENODEV);
  auto context = std::make_shared<SoftContext>();
  if (!context->doorbell.open()) return nullptr;  // errno from pipe2
  context->device = d;
  context->cmd_fd = -1;
  context->async_fd = context->doorbell.read_fd();
  context->num_comp_vectors = 1;
  // IB unicast LIDs are 1..0xbfff; each context is a port of its own.
  context->lid = f.next_lid;
  f.next_lid = static_cast<std::uint16_t>(f.next_lid % 0xbfff + 1);
  return adopt<SoftContext, ibv_context>(f, f.contexts, std::move(context));
}

int sv_close_device(ibv_context* context) {
  auto [f, lock, c] = lock_and_find("ibv_close_device", &Fabric::contexts, context);
  if (c == nullptr) return EINVAL;
  if (c->pds + c->cqs + c->channels != 0) return EBUSY;
  if (!c->doorbell.close()) misuse(f, "ibv_close_device: the caller closed async_fd, which the context owns");
  retire(f, f.contexts, context);
  return 0;
}

int sv_query_device(ibv_context* context, ibv_device_attr* attr) {
  auto [f, lock, c] = lock_and_find("ibv_query_device", &Fabric::contexts, context);
  if (c == nullptr || attr == nullptr) return EINVAL;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "soft-1.0");
  attr->node_guid = 0x0250'53ff'fe00'0001;
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = ~std::uint64_t{0};
  attr->page_size_cap = 4096;
  attr->vendor_id = 0x5350;  // arbitrary; no real vendor
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = static_cast<int>(f.config.max_qp_wr);
  attr->max_sge = kMaxSge;
  attr->max_cq = 1 << 16;
  attr->max_cqe = f.config.max_cqe;
  attr->max_mr = 1 << 24;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = kMaxRdAtomic;
  attr->max_qp_init_rd_atom = kMaxRdAtomic;
  attr->max_res_rd_atom = kMaxRdAtomic << 16;
  attr->atomic_cap = f.config.atomic_cap;
  attr->max_pkeys = 1;
  attr->phys_port_cnt = kPort;
  return 0;
}

int sv_query_port(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) {
  auto [f, lock, c] = lock_and_find("ibv_query_port", &Fabric::contexts, context);
  if (c == nullptr || attr == nullptr || port != kPort) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = kMtu;
  attr->active_mtu = kMtu;
  attr->gid_tbl_len = static_cast<int>(f.config.gids.size());
  attr->max_msg_sz = f.config.max_msg_sz;
  attr->pkey_tbl_len = 1;
  attr->link_layer = f.config.link_layer;
  attr->lid = is_ethernet(f) ? 0 : c->lid;
  attr->sm_lid = is_ethernet(f) ? 0 : 1;
  attr->max_vl_num = 1;
  attr->active_width = 2;  // 4x
  attr->active_speed = 32; // EDR
  attr->phys_state = 5;    // LinkUp
  return 0;
}

/// libibverbs' ibv_query_gid: -1 with errno on failure; an unpopulated slot reads as zeros.
int sv_query_gid(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid) {
  auto [f, lock, c] = lock_and_find("ibv_query_gid", &Fabric::contexts, context);
  if (c == nullptr || gid == nullptr || port != kPort || index < 0 ||
      static_cast<std::size_t>(index) >= f.config.gids.size()) {
    return minus_one_with_errno(EINVAL);
  }
  *gid = f.config.gids[static_cast<std::size_t>(index)].first;
  return 0;
}

/// _ibv_query_gid_ex: returns the errno value; ENODATA for an unpopulated slot.
int sv_query_gid_ex(ibv_context* context, std::uint32_t port, std::uint32_t index, ibv_gid_entry* entry,
                    std::uint32_t flags, std::size_t entry_size) {
  auto [f, lock, c] = lock_and_find("_ibv_query_gid_ex", &Fabric::contexts, context);
  if (c == nullptr || entry == nullptr || flags != 0 ||
      entry_size < sizeof(ibv_gid_entry) || port != kPort || index >= f.config.gids.size()) {
    return EINVAL;
  }
  const ibv_gid* gid = populated_gid(f, index);
  if (gid == nullptr) return ENODATA;
  *entry = ibv_gid_entry{};
  entry->gid = *gid;
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = static_cast<std::uint32_t>(f.config.gids[index].second);
  entry->ndev_ifindex = is_ethernet(f) ? 2 : 0;
  return 0;
}

// ===========================================================================
// Protection domains and memory regions
// ===========================================================================

ibv_pd* sv_alloc_pd(ibv_context* context) {
  auto [f, lock, c] = lock_and_find("ibv_alloc_pd", &Fabric::contexts, context);
  if (c == nullptr) return null_with_errno(EINVAL);
  auto pd = std::make_shared<SoftPd>();
  pd->context = c;
  pd->handle = f.next_handle++;
  ++c->pds;
  return adopt<SoftPd, ibv_pd>(f, f.pds, std::move(pd));
}

int sv_dealloc_pd(ibv_pd* pd) {
  auto [f, lock, p] = lock_and_find("ibv_dealloc_pd", &Fabric::pds, pd);
  if (p == nullptr) return EINVAL;
  if (p->mrs + p->qps != 0) return EBUSY;
  --context_of(f, p->context).pds;
  retire(f, f.pds, pd);
  return 0;
}

/// What the device accepts: remote write or atomic access needs local write;
/// optional flags (relaxed ordering and the rest of libibverbs' optional
/// range) are accepted; on-demand paging and zero-based MRs are not supported.
bool access_is_valid(int access) {
  constexpr int supported = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB |
                            IBV_ACCESS_OPTIONAL_RANGE;
  if ((access & ~supported) != 0) return false;
  const bool needs_local_write = (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  return !needs_local_write || (access & IBV_ACCESS_LOCAL_WRITE) != 0;
}

ibv_mr* register_mr(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, int access) {
  auto [f, lock, p] = lock_and_find("ibv_reg_mr", &Fabric::pds, pd);
  if (p == nullptr) return null_with_errno(EINVAL);
  if (f.fail_reg_mr != 0) return null_with_errno(std::exchange(f.fail_reg_mr, 0));
  const auto start = reinterpret_cast<std::uintptr_t>(addr);
  if (addr == nullptr || length == 0 || !access_is_valid(access) || start + length < start ||
      iova + length < iova) {
    return null_with_errno(EINVAL);
  }
  auto mr = std::make_shared<SoftMr>();
  mr->context = p->context;
  mr->pd = p;
  mr->addr = addr;
  mr->length = length;
  mr->handle = f.next_handle++;
  // Distinct low bytes: no lkey ever equals an rkey, so a caller that swaps
  // them fails.
  const std::uint32_t n = f.next_key++;
  mr->lkey = (n << 8) | 0x1a;
  mr->rkey = (n << 8) | 0xb5;
  mr->access = access;
  mr->iova = iova;
  f.by_lkey[mr->lkey] = mr.get();
  f.by_rkey[mr->rkey] = mr.get();
  ++p->mrs;
  return adopt<SoftMr, ibv_mr>(f, f.mrs, std::move(mr));
}

ibv_mr* sv_reg_mr(ibv_pd* pd, void* addr, std::size_t length, int access) {
  return register_mr(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr), access);
}

ibv_mr* sv_reg_mr_iova2(ibv_pd* pd, void* addr, std::size_t length, std::uint64_t iova, unsigned int access) {
  return register_mr(pd, addr, length, iova, static_cast<int>(access));
}

int sv_dereg_mr(ibv_mr* mr) {
  auto [f, lock, m] = lock_and_find("ibv_dereg_mr", &Fabric::mrs, mr);
  if (m == nullptr) return EINVAL;
  f.by_lkey.erase(m->lkey);
  f.by_rkey.erase(m->rkey);
  --f.pds.at(m->pd)->mrs;
  retire(f, f.mrs, mr);
  return 0;
}

// ===========================================================================
// Completion channels and completion queues
// ===========================================================================

ibv_comp_channel* sv_create_comp_channel(ibv_context* context) {
  auto [f, lock, c] = lock_and_find("ibv_create_comp_channel", &Fabric::contexts, context);
  if (c == nullptr) return null_with_errno(EINVAL);
  auto channel = std::make_shared<SoftChannel>();
  if (!channel->doorbell.open()) return nullptr;
  channel->context = c;
  channel->fd = channel->doorbell.read_fd();
  ++c->channels;
  return adopt<SoftChannel, ibv_comp_channel>(f, f.channels, std::move(channel));
}

int sv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto [f, lock, ch] = lock_and_find("ibv_destroy_comp_channel", &Fabric::channels, channel);
  if (ch == nullptr) return EINVAL;
  if (ch->cqs != 0) return EBUSY;
  if (!ch->doorbell.close()) {
    misuse(f, "ibv_destroy_comp_channel: the caller closed the channel's fd, which the channel owns");
  }
  --context_of(f, ch->context).channels;
  retire(f, f.channels, channel);
  return 0;
}

ibv_cq* sv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector) {
  auto [f, lock, c] = lock_and_find("ibv_create_cq", &Fabric::contexts, context);
  SoftChannel* ch = channel != nullptr ? find(f, "ibv_create_cq", f.channels, channel) : nullptr;
  const bool channel_ok = channel == nullptr || (ch != nullptr && ch->context == c);
  if (c == nullptr || !channel_ok || cqe < 1 || cqe > f.config.max_cqe || comp_vector != 0) {
    return null_with_errno(EINVAL);
  }
  auto cq = std::make_shared<SoftCq>();
  cq->context = c;
  cq->channel = ch;
  cq->cq_context = cq_context;
  cq->handle = f.next_handle++;
  cq->cqe = cqe;
  ++c->cqs;
  if (ch != nullptr) ++ch->cqs;
  return adopt<SoftCq, ibv_cq>(f, f.cqs, std::move(cq));
}

/// Unread async events about `object` go with it, as the kernel drops them.
void drop_async_events_of(SoftContext& context, const void* object) {
  std::erase_if(context.events, [object](const ibv_async_event& e) { return event_object(e) == object; });
}

int sv_destroy_cq(ibv_cq* cq) {
  auto [f, lock, q] = lock_and_find("ibv_destroy_cq", &Fabric::cqs, cq);
  if (q == nullptr) return EINVAL;
  // libibverbs would block until every event read for the CQ is acknowledged;
  // from a progress thread that is a deadlock, so it is refused here.
  if (q->qps != 0 || q->events_read != q->events_acked || q->async_read != q->async_acked) return EBUSY;
  if (auto* ch = static_cast<SoftChannel*>(q->channel)) {
    std::erase(ch->events, q);
    --ch->cqs;
  }
  auto& context = context_of(f, q->context);
  drop_async_events_of(context, q);
  --context.cqs;
  retire(f, f.cqs, cq);
  return 0;
}

int sv_req_notify_cq(ibv_cq* cq, int /*solicited_only*/) {
  auto [f, lock, q] = lock_and_find("ibv_req_notify_cq", &Fabric::cqs, cq);
  if (q == nullptr) return EINVAL;
  // Only a completion added after arming notifies, as the verbs spec says:
  // entries already queued do not, so a caller must poll after arming.
  q->armed = true;
  return 0;
}

/// Adds a completion; a full CQ loses it and raises IBV_EVENT_CQ_ERR, as a
/// device's CQ overrun does.
void push_completion(Fabric& f, SoftCq& cq, const Cqe& cqe) {
  if (cq.entries.size() >= static_cast<std::size_t>(cq.cqe)) {
    if (is_current(f, cq)) ++f.cq_overruns;
    ibv_async_event event{};
    event.event_type = IBV_EVENT_CQ_ERR;
    event.element.cq = &cq;
    push_async_event(context_of(f, cq.context), event);
    return;
  }
  cq.entries.push_back(cqe);
  if (!cq.armed) return;
  cq.armed = false;
  if (auto* ch = static_cast<SoftChannel*>(cq.channel)) {
    ch->events.push_back(&cq);
    ch->doorbell.ring();
  }
}

/// Reads the oldest event queued on `owner` (a completion channel or a
/// context) the way libibverbs does: waits for the doorbell's byte without
/// the lock, since that read may block, then takes the event under it. A byte
/// with no event left behind it (the event went with its CQ or QP) is passed
/// over. `deliver(fabric, owner, event)` hands the event out, under the lock.
template <class Soft, class Deliver>
int read_event(const char* call, Live<Soft> Fabric::*live, const void* handle, bool out_params_ok,
               Deliver deliver) {
  int fd = -1;
  {
    auto [f, lock, owner] = lock_and_find(call, live, handle);
    if (owner == nullptr || !out_params_ok) return minus_one_with_errno(EINVAL);
    fd = owner->doorbell.read_fd();
  }
  for (;;) {
    if (!take_doorbell_byte(fd)) return -1;
    auto [f, lock, owner] = lock_and_find(call, live, handle);
    if (owner == nullptr) return minus_one_with_errno(EBADF);
    owner->doorbell.taken();
    if (owner->events.empty()) continue;  // its event went with its CQ or QP
    const auto event = owner->events.front();
    owner->events.pop_front();
    if (!owner->events.empty()) owner->doorbell.ring();
    deliver(f, *owner, event);
    return 0;
  }
}

int sv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  return read_event("ibv_get_cq_event", &Fabric::channels, channel, cq != nullptr && cq_context != nullptr,
                    [&](Fabric&, SoftChannel&, SoftCq* q) {
                      ++q->events_read;
                      *cq = q;
                      *cq_context = q->cq_context;
                    });
}

void sv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  auto [f, lock, q] = lock_and_find("ibv_ack_cq_events", &Fabric::cqs, cq);
  if (q == nullptr) return;
  q->events_acked += nevents;
  if (q->events_acked > q->events_read) {
    misuse(f, "ibv_ack_cq_events: more events acknowledged than read");
    q->events_acked = q->events_read;
  }
}

/// A polled completion frees its send-queue slot and those of the earlier
/// (unsignaled) work requests of its QP.
void release_slots(Fabric& f, const Cqe& cqe) {
  const auto it = f.by_qpn.find(cqe.wc.qp_num);
  if (it == f.by_qpn.end()) return;  // the QP is gone
  SoftQp& qp = *it->second;
  qp.released = std::max(qp.released, std::min(cqe.seq, qp.posted));
}

int sv_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  auto [f, lock, q] = lock_and_find("ibv_poll_cq", &Fabric::cqs, cq);
  if (q == nullptr || (num_entries > 0 && wc == nullptr)) return -EINVAL;
  int n = 0;
  for (; n < num_entries && !q->entries.empty(); ++n) {
    const Cqe cqe = q->entries.front();
    q->entries.pop_front();
    wc[n] = cqe.wc;
    release_slots(f, cqe);
  }
  if (n > 0) f.changed.notify_all();
  return n;
}

// ===========================================================================
// Queue pairs
// ===========================================================================

ibv_qp* sv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  auto [f, lock, p] = lock_and_find("ibv_create_qp", &Fabric::pds, pd);
  SoftCq* send_cq = p != nullptr && attr != nullptr ? find(f, "ibv_create_qp", f.cqs, attr->send_cq) : nullptr;
  SoftCq* recv_cq = send_cq != nullptr ? find(f, "ibv_create_qp", f.cqs, attr->recv_cq) : nullptr;
  if (recv_cq == nullptr || send_cq->context != p->context || recv_cq->context != p->context ||
      attr->qp_type != IBV_QPT_RC || attr->srq != nullptr || attr->cap.max_send_wr > f.config.max_qp_wr ||
      attr->cap.max_recv_wr > f.config.max_qp_wr || attr->cap.max_send_sge > kMaxSge ||
      attr->cap.max_recv_sge > kMaxSge || attr->cap.max_inline_data != 0) {
    return null_with_errno(EINVAL);
  }
  auto qp = std::make_shared<SoftQp>();
  qp->context = p->context;
  qp->qp_context = attr->qp_context;
  qp->pd = p;
  qp->send_cq = send_cq;
  qp->recv_cq = recv_cq;
  qp->handle = f.next_handle++;
  // 24-bit, never 0 or 1 (the special QPs) and never reused.
  qp->qp_num = f.next_qpn;
  f.next_qpn = f.next_qpn >= k24Bits ? 2 : f.next_qpn + 1;
  qp->state = IBV_QPS_RESET;
  qp->qp_type = IBV_QPT_RC;
  qp->cap = attr->cap;
  qp->signal_all = attr->sq_sig_all != 0;
  attr->cap.max_inline_data = 0;
  ++p->qps;
  ++send_cq->qps;
  ++recv_cq->qps;
  f.by_qpn[qp->qp_num] = qp.get();
  return adopt<SoftQp, ibv_qp>(f, f.qps, std::move(qp));
}

bool is_atomic(ibv_wr_opcode opcode) {
  return opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
}

bool is_send(ibv_wr_opcode opcode) { return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM; }

/// The operations that take the responder's next posted receive.
bool consumes_receive(ibv_wr_opcode opcode) { return is_send(opcode) || opcode == IBV_WR_RDMA_WRITE_WITH_IMM; }

bool carries_immediate(ibv_wr_opcode opcode) {
  return opcode == IBV_WR_SEND_WITH_IMM || opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

ibv_wc_opcode completion_opcode(ibv_wr_opcode opcode) {
  switch (opcode) {
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: return IBV_WC_SEND;
    default: return IBV_WC_RDMA_WRITE;  // with immediate too
  }
}

Cqe make_cqe(const SoftQp& qp, const Work& work, ibv_wc_status status, std::uint32_t byte_len) {
  Cqe cqe{};
  cqe.seq = work.seq;
  cqe.wc.wr_id = work.wr_id;
  cqe.wc.status = status;
  cqe.wc.opcode = completion_opcode(work.opcode);
  cqe.wc.byte_len = byte_len;
  cqe.wc.qp_num = qp.qp_num;
  return cqe;
}

/// Completes `w` unexecuted, with IBV_WC_WR_FLUSH_ERR: what a QP in the
/// error state does with its work, signaled or not.
void flush(Fabric& f, const SoftQp& qp, const Work& w) {
  push_completion(f, send_cq_of(qp), make_cqe(qp, w, IBV_WC_WR_FLUSH_ERR, 0));
}

/// A receive's completion on the QP's receive CQ. Its seq is 0: polling it
/// frees no send-queue slot.
void complete_receive(Fabric& f, const SoftQp& qp, const Receive& r, ibv_wc_status status, ibv_wc_opcode opcode,
                      std::uint32_t byte_len) {
  Cqe cqe{};
  cqe.wc.wr_id = r.wr_id;
  cqe.wc.status = status;
  cqe.wc.opcode = opcode;
  cqe.wc.byte_len = byte_len;
  cqe.wc.qp_num = qp.qp_num;
  push_completion(f, recv_cq_of(qp), cqe);
}

/// A QP in the error state flushes its posted receives, as it does its sends.
void flush_receives(Fabric& f, SoftQp& qp) {
  for (const Receive& r : std::exchange(qp.receives, {})) {
    complete_receive(f, qp, r, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
  }
}

/// Takes the QP's queued work out of the worker's queue, in post order.
std::vector<Work> take_queued_work(Fabric& f, const SoftQp& qp) {
  std::vector<Work> taken;
  for (auto it = f.work.begin(); it != f.work.end();) {
    if (it->qp == &qp) {
      taken.push_back(*it);
      it = f.work.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

/// The QP enters the error state: everything it still has queued completes
/// with IBV_WC_WR_FLUSH_ERR, signaled or not.
void enter_error(Fabric& f, SoftQp& qp) {
  qp.actual = IBV_QPS_ERR;
  for (const Work& w : take_queued_work(f, qp)) flush(f, qp, w);
  flush_receives(f, qp);
}

/// Back to RESET: queued work is discarded without completions and the
/// connection forgotten.
void enter_reset(Fabric& f, SoftQp& qp) {
  take_queued_work(f, qp);
  qp.receives.clear();
  qp.actual = IBV_QPS_RESET;
  qp.released = qp.posted;
  qp.access = 0;
  qp.dest_qpn = qp.rq_psn = qp.sq_psn = 0;
  qp.dlid = 0;
  qp.max_rd_atomic = qp.max_dest_rd_atomic = 0;
  qp.timeout = qp.retry_cnt = qp.rnr_retry = qp.min_rnr_timer = 0;
}

struct Transition {
  ibv_qp_state from, to;
  int required, optional;  // attribute mask bits besides IBV_QP_STATE
};

// The RC rows of the verbs spec's state transition table this device supports.
constexpr Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER},
};

bool transition_allowed(ibv_qp_state from, ibv_qp_state to, int mask) {
  const int others = mask & ~IBV_QP_STATE;
  // Any state may go to RESET or ERR, with the state alone.
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return (mask & IBV_QP_STATE) != 0 && others == 0;
  for (const Transition& t : kTransitions) {
    if (t.from == from && t.to == to) {
      return (others & t.required) == t.required && (others & ~(t.required | t.optional)) == 0;
    }
  }
  return false;
}

/// The address vector must lead somewhere on this fabric: port 1, a valid
/// source GID when a GRH is used, and a LID of some port (IB) or a GID of the
/// table (RoCE, where the GRH is mandatory).
bool address_vector_is_valid(const Fabric& f, const ibv_ah_attr& av) {
  if (av.port_num != kPort) return false;
  if (av.is_global != 0 && populated_gid(f, av.grh.sgid_index) == nullptr) return false;
  if (is_ethernet(f)) {
    if (av.is_global == 0) return false;
    for (std::size_t i = 0; i < f.config.gids.size(); ++i) {
      const ibv_gid* gid = populated_gid(f, i);
      if (gid != nullptr && std::memcmp(gid->raw, av.grh.dgid.raw, sizeof gid->raw) == 0) return true;
    }
    return false;
  }
  return std::any_of(f.contexts.begin(), f.contexts.end(),
                     [&](const auto& entry) { return entry.second->lid == av.dlid; });
}

/// The values a device accepts for the attributes present in `mask`.
bool attribute_values_are_valid(const Fabric& f, const ibv_qp_attr& attr, int mask) {
  constexpr unsigned qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
  const auto has = [mask](int bit) { return (mask & bit) != 0; };
  if (has(IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) return false;  // the P_Key table has one entry
  if (has(IBV_QP_PORT) && attr.port_num != kPort) return false;
  if (has(IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~qp_access) != 0) return false;
  if (has(IBV_QP_AV) && !address_vector_is_valid(f, attr.ah_attr)) return false;
  if (has(IBV_QP_PATH_MTU) && (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > kMtu)) return false;
  // 5-bit and 3-bit fields of the wire protocol.
  if (has(IBV_QP_TIMEOUT) && attr.timeout > 31) return false;
  if (has(IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) return false;
  if (has(IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) return false;
  if (has(IBV_QP_RNR_RETRY) && attr.rnr_retry > 7) return false;
  if (has(IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > kMaxRdAtomic) return false;
  return !(has(IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > kMaxRdAtomic);
}

void record_attributes(SoftQp& qp, const ibv_qp_attr& attr, int mask) {
  if ((mask & IBV_QP_ACCESS_FLAGS) != 0) qp.access = static_cast<int>(attr.qp_access_flags);
  if ((mask & IBV_QP_AV) != 0) qp.dlid = attr.ah_attr.dlid;
  if ((mask & IBV_QP_DEST_QPN) != 0) qp.dest_qpn = attr.dest_qp_num & k24Bits;
  if ((mask & IBV_QP_RQ_PSN) != 0) qp.rq_psn = attr.rq_psn & k24Bits;
  if ((mask & IBV_QP_SQ_PSN) != 0) qp.sq_psn = attr.sq_psn & k24Bits;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) != 0) qp.max_rd_atomic = attr.max_rd_atomic;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) != 0) qp.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if ((mask & IBV_QP_TIMEOUT) != 0) qp.timeout = attr.timeout;
  if ((mask & IBV_QP_RETRY_CNT) != 0) qp.retry_cnt = attr.retry_cnt;
  if ((mask & IBV_QP_RNR_RETRY) != 0) qp.rnr_retry = attr.rnr_retry;
  if ((mask & IBV_QP_MIN_RNR_TIMER) != 0) qp.min_rnr_timer = attr.min_rnr_timer;
}

int sv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  auto [f, lock, q] = lock_and_find("ibv_modify_qp", &Fabric::qps, qp);
  if (q == nullptr || attr == nullptr) return EINVAL;
  const ibv_qp_state from = q->actual;
  const ibv_qp_state to = (attr_mask & IBV_QP_STATE) != 0 ? attr->qp_state : from;
  if ((attr_mask & IBV_QP_CUR_STATE) != 0 && attr->cur_qp_state != from) return EINVAL;
  if (!transition_allowed(from, to, attr_mask) || !attribute_values_are_valid(f, *attr, attr_mask)) return EINVAL;
  if (to == IBV_QPS_RESET) {
    enter_reset(f, *q);
  } else if (to == IBV_QPS_ERR) {
    enter_error(f, *q);
  } else {
    record_attributes(*q, *attr, attr_mask);
    q->actual = to;
  }
  q->state = to;
  f.work_cv.notify_all();  // a request waiting for this QP to answer may go now
  f.changed.notify_all();
  return 0;
}

int sv_destroy_qp(ibv_qp* qp) {
  auto [f, lock, q] = lock_and_find("ibv_destroy_qp", &Fabric::qps, qp);
  if (q == nullptr) return EINVAL;
  // libibverbs would block until the QP's async events read are acknowledged.
  if (q->async_read != q->async_acked) return EBUSY;
  take_queued_work(f, *q);  // discarded, as hardware does
  q->receives.clear();
  drop_async_events_of(context_of(f, q->context), q);
  f.by_qpn.erase(q->qp_num);
  --f.pds.at(q->pd)->qps;
  --f.cqs.at(q->send_cq)->qps;
  --f.cqs.at(q->recv_cq)->qps;
  retire(f, f.qps, qp);
  f.changed.notify_all();
  return 0;
}

// ===========================================================================
// Posting and executing work requests
// ===========================================================================

/// The operations the device executes: RDMA READ and WRITE (with immediate
/// too), SEND (with immediate too), and the atomics when it has them.
bool opcode_supported(const Fabric& f, ibv_wr_opcode opcode) {
  if (opcode == IBV_WR_RDMA_READ || opcode == IBV_WR_RDMA_WRITE || consumes_receive(opcode)) return true;
  return is_atomic(opcode) && f.config.atomic_cap != IBV_ATOMIC_NONE;
}

/// The synchronous checks of post_send; 0 when the work request is accepted.
int check_work_request(const Fabric& f, const SoftQp& qp, const ibv_send_wr& wr) {
  if (qp.actual != IBV_QPS_RTS && qp.actual != IBV_QPS_ERR) return EINVAL;
  if (!opcode_supported(f, wr.opcode)) return EINVAL;
  if (wr.num_sge < 0 || wr.num_sge > static_cast<int>(qp.cap.max_send_sge) || (wr.num_sge > 0 && wr.sg_list == nullptr)) {
    return EINVAL;
  }
  // No inline data (max_inline_data is 0) and no other flags.
  if ((wr.send_flags & ~static_cast<unsigned>(IBV_SEND_SIGNALED | IBV_SEND_FENCE)) != 0) return EINVAL;
  if (qp.occupied() >= qp.cap.max_send_wr) return ENOMEM;
  return 0;
}

void accept_work_request(Fabric& f, SoftQp& qp, const ibv_send_wr& wr) {
  Work w{};
  w.qp = &qp;
  w.seq = ++qp.posted;
  w.wr_id = wr.wr_id;
  w.opcode = wr.opcode;
  w.signaled = qp.signal_all || (wr.send_flags & IBV_SEND_SIGNALED) != 0;
  if (wr.num_sge == 1) {
    w.local_addr = wr.sg_list[0].addr;
    w.lkey = wr.sg_list[0].lkey;
    w.length = wr.sg_list[0].length;
  }
  // The union's members lay rkey out differently: read the opcode's own.
  if (is_atomic(wr.opcode)) {
    w.remote_addr = wr.wr.atomic.remote_addr;
    w.rkey = wr.wr.atomic.rkey;
    w.compare_add = wr.wr.atomic.compare_add;
    w.swap = wr.wr.atomic.swap;
  } else if (!is_send(wr.opcode)) {
    w.remote_addr = wr.wr.rdma.remote_addr;
    w.rkey = wr.wr.rdma.rkey;
  }
  if (carries_immediate(wr.opcode)) w.imm_data = wr.imm_data;
  if (is_current(f, qp)) {
    ++f.posted;
    f.max_outstanding = std::max<std::size_t>(f.max_outstanding, qp.occupied());
  }
  if (qp.actual == IBV_QPS_ERR) {
    flush(f, qp, w);
  } else {
    f.work.push_back(w);
  }
}

int sv_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  auto [f, lock, q] = lock_and_find("ibv_post_send", &Fabric::qps, qp);
  if (q == nullptr) {
    if (bad_wr != nullptr) *bad_wr = wr;
    return EINVAL;
  }
  if (wr != nullptr && check_work_request(f, *q, *wr) == 0 && is_current(f, *q)) ++f.post_calls;
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    const int err = check_work_request(f, *q, *w);
    if (err != 0) {
      if (err == ENOMEM && is_current(f, *q)) ++f.overruns;
      if (bad_wr != nullptr) *bad_wr = w;
      f.work_cv.notify_all();
      return err;
    }
    accept_work_request(f, *q, *w);
  }
  f.work_cv.notify_all();
  f.changed.notify_all();
  return 0;
}

/// The synchronous checks of post_recv; 0 when the receive is accepted.
/// Receives may be posted from INIT on (before the QP can be reached, as a
/// peer's first SEND needs), not in RESET.
int check_receive(const SoftQp& qp, const ibv_recv_wr& wr) {
  if (qp.actual == IBV_QPS_RESET) return EINVAL;
  if (wr.num_sge < 0 || wr.num_sge > static_cast<int>(qp.cap.max_recv_sge) || (wr.num_sge > 0 && wr.sg_list == nullptr)) {
    return EINVAL;
  }
  if (qp.receives.size() >= qp.cap.max_recv_wr) return ENOMEM;
  return 0;
}

int sv_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  auto [f, lock, q] = lock_and_find("ibv_post_recv", &Fabric::qps, qp);
  if (q == nullptr) {
    if (bad_wr != nullptr) *bad_wr = wr;
    return EINVAL;
  }
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    if (const int err = check_receive(*q, *w); err != 0) {
      if (bad_wr != nullptr) *bad_wr = w;
      return err;
    }
    Receive r;
    r.wr_id = w->wr_id;
    if (w->num_sge == 1) {
      r.addr = w->sg_list[0].addr;
      r.lkey = w->sg_list[0].lkey;
      r.length = w->sg_list[0].length;
    }
    if (is_current(f, *q)) ++f.receives_posted;
    if (q->actual == IBV_QPS_ERR) {
      complete_receive(f, *q, r, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
    } else {
      q->receives.push_back(r);
    }
  }
  f.work_cv.notify_all();  // a SEND waiting for a receive (RNR) may go now
  f.changed.notify_all();
  return 0;
}

/// The bytes [addr, addr + length) of the MR behind `key` if it is in `pd`
/// and allows `needed`; null otherwise.
std::byte* resolve(const std::unordered_map<std::uint32_t, SoftMr*>& keys, std::uint32_t key, const ibv_pd* pd,
                   std::uint64_t addr, std::uint32_t length, int needed) {
  const auto it = keys.find(key);
  if (it == keys.end()) return nullptr;
  const SoftMr& mr = *it->second;
  if (mr.pd != pd || (mr.access & needed) != needed) return nullptr;
  if (addr < mr.iova || length > mr.length || addr - mr.iova > mr.length - length) return nullptr;
  return static_cast<std::byte*>(mr.addr) + (addr - mr.iova);
}

/// The QP that answers `qp`'s requests, or null when its packets would go
/// unanswered (the requester retries, then fails): the destination QP
/// must exist, be able to receive (RTR or RTS), be connected back to `qp`
/// with the matching PSN, and sit behind the LID `qp` addresses.
SoftQp* responder_for(Fabric& f, const SoftQp& qp) {
  const auto it = f.by_qpn.find(qp.dest_qpn);
  if (it == f.by_qpn.end()) return nullptr;
  SoftQp* remote = it->second;
  if (remote->actual != IBV_QPS_RTR && remote->actual != IBV_QPS_RTS) return nullptr;
  if (remote->dest_qpn != qp.qp_num || remote->rq_psn != qp.sq_psn) return nullptr;
  if (!is_ethernet(f) && context_of(f, remote->context).lid != qp.dlid) return nullptr;
  return remote;
}

/// How a work request ended. A responder that rejects a request (remote
/// access or invalid request) enters the error state too, and reports it on
/// its own context, as RC hardware does.
struct Outcome {
  ibv_wc_status status = IBV_WC_SUCCESS;
  SoftQp* rejected_by = nullptr;
  std::optional<ibv_event_type> event = std::nullopt;  // what the responder raises, if anything
};

Outcome rejected(SoftQp& responder, ibv_wc_status status, ibv_event_type event) {
  return {status, &responder, event};
}

/// Executes one atomic: the checks a device makes, in its order, then the
/// operation on the word. It runs under the fabric lock, like every copy, so
/// no RDMA READ or WRITE of the word interleaves with it; std::atomic_ref
/// keeps it atomic for host code using std::atomic_ref on the word too.
Outcome apply_atomic(Fabric& f, const SoftQp& qp, const Work& w) {
  constexpr std::uint32_t word_size = sizeof(std::uint64_t);
  // The local buffer receives the old value: exactly one word, writable.
  if (w.length != word_size) return {IBV_WC_LOC_LEN_ERR};
  std::byte* local = resolve(f.by_lkey, w.lkey, qp.pd, w.local_addr, w.length, IBV_ACCESS_LOCAL_WRITE);
  if (local == nullptr) return {IBV_WC_LOC_PROT_ERR};
  // Atomics use the same initiator resources as reads.
  if (qp.max_rd_atomic == 0) return {IBV_WC_LOC_QP_OP_ERR};
  SoftQp* remote = responder_for(f, qp);
  if (remote == nullptr) return {IBV_WC_RETRY_EXC_ERR};
  if ((remote->access & IBV_ACCESS_REMOTE_ATOMIC) == 0 || remote->max_dest_rd_atomic == 0 ||
      w.remote_addr % word_size != 0) {
    return rejected(*remote, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
  }
  std::byte* target = resolve(f.by_rkey, w.rkey, remote->pd, w.remote_addr, word_size, IBV_ACCESS_REMOTE_ATOMIC);
  if (target == nullptr) return rejected(*remote, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
  // The MR's start may be misaligned in host memory even when the word's
  // address (an IOVA) is aligned: only an aligned host word is atomic.
  if (reinterpret_cast<std::uintptr_t>(target) % alignof(std::uint64_t) != 0) {
    return rejected(*remote, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
  }
  std::atomic_ref<std::uint64_t> word(*reinterpret_cast<std::uint64_t*>(target));
  std::uint64_t old = 0;
  if (w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    old = word.fetch_add(w.compare_add);
  } else {
    old = w.compare_add;
    word.compare_exchange_strong(old, w.swap);  // `old` becomes the word's value either way
  }
  std::memcpy(local, &old, sizeof old);
  return {IBV_WC_SUCCESS};
}

/// Executes one SEND, SEND with immediate or RDMA WRITE with immediate: the
/// requester's checks, the responder's (its QP, for a write its MR, then its
/// next posted receive), the write's copy, and the receive's completion on
/// the responder's CQ. A SEND lands in the receive's buffer; a write with
/// immediate only completes the receive. No posted receive is an RNR NAK:
/// once the requester's rnr_retry is spent, IBV_WC_RNR_RETRY_EXC_ERR, and the
/// responder is not affected. A receive too short for the SEND (or whose
/// buffer the responder cannot write) fails on both sides, as on hardware.
Outcome deliver(Fabric& f, const SoftQp& qp, const Work& w) {
  if (w.length > f.config.max_msg_sz) return {IBV_WC_LOC_LEN_ERR};
  std::byte* local = nullptr;
  if (w.length > 0) {
    local = resolve(f.by_lkey, w.lkey, qp.pd, w.local_addr, w.length, 0);
    if (local == nullptr) return {IBV_WC_LOC_PROT_ERR};
  }
  SoftQp* remote = responder_for(f, qp);
  if (remote == nullptr) return {IBV_WC_RETRY_EXC_ERR};
  const bool write = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (write && (remote->access & IBV_ACCESS_REMOTE_WRITE) == 0) {
    return rejected(*remote, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
  }
  std::byte* target = nullptr;
  if (write && w.length > 0) {
    target = resolve(f.by_rkey, w.rkey, remote->pd, w.remote_addr, w.length, IBV_ACCESS_REMOTE_WRITE);
    if (target == nullptr) return rejected(*remote, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
  }
  if (remote->receives.empty()) return {IBV_WC_RNR_RETRY_EXC_ERR};
  const Receive r = remote->receives.front();
  remote->receives.pop_front();
  if (!write && w.length > 0) {
    if (w.length > r.length) {
      complete_receive(f, *remote, r, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0);
      return {IBV_WC_REM_INV_REQ_ERR, remote, std::nullopt};
    }
    target = resolve(f.by_lkey, r.lkey, remote->pd, r.addr, w.length, IBV_ACCESS_LOCAL_WRITE);
    if (target == nullptr) {
      complete_receive(f, *remote, r, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
      return {IBV_WC_REM_OP_ERR, remote, std::nullopt};
    }
  }
  if (target != nullptr) std::memmove(target, local, w.length);
  Cqe cqe{};
  cqe.wc.wr_id = r.wr_id;
  cqe.wc.status = IBV_WC_SUCCESS;
  cqe.wc.opcode = write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  cqe.wc.byte_len = w.length;
  cqe.wc.qp_num = remote->qp_num;
  cqe.wc.src_qp = qp.qp_num;
  if (carries_immediate(w.opcode)) {
    cqe.wc.wc_flags = IBV_WC_WITH_IMM;
    cqe.wc.imm_data = w.imm_data;
  }
  push_completion(f, recv_cq_of(*remote), cqe);
  return {IBV_WC_SUCCESS};
}

/// Executes one work request: the checks a device makes, in its order, then
/// the copy (or the atomic, or the message).
Outcome transfer(Fabric& f, const SoftQp& qp, const Work& w) {
  if (auto fault = std::exchange(f.fail_completion, std::nullopt)) return {*fault};
  if (is_atomic(w.opcode)) return apply_atomic(f, qp, w);
  if (consumes_receive(w.opcode)) return deliver(f, qp, w);
  const bool read = w.opcode == IBV_WR_RDMA_READ;
  if (w.length > f.config.max_msg_sz) return {IBV_WC_LOC_LEN_ERR};
  std::byte* local = nullptr;
  if (w.length > 0) {
    local = resolve(f.by_lkey, w.lkey, qp.pd, w.local_addr, w.length, read ? IBV_ACCESS_LOCAL_WRITE : 0);
    if (local == nullptr) return {IBV_WC_LOC_PROT_ERR};
  }
  // A requester allowed no outstanding reads cannot issue one.
  if (read && qp.max_rd_atomic == 0) return {IBV_WC_LOC_QP_OP_ERR};
  SoftQp* remote = responder_for(f, qp);
  if (remote == nullptr) return {IBV_WC_RETRY_EXC_ERR};
  // The responder QP must allow the operation (and, for reads, hold one).
  const int needed = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
  if ((remote->access & needed) == 0 || (read && remote->max_dest_rd_atomic == 0)) {
    return rejected(*remote, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR);
  }
  // A zero-length RDMA operation checks no R_Key and moves nothing.
  if (w.length == 0) return {IBV_WC_SUCCESS};
  std::byte* target = resolve(f.by_rkey, w.rkey, remote->pd, w.remote_addr, w.length, needed);
  if (target == nullptr) return rejected(*remote, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
  if (read) {
    std::memmove(local, target, w.length);
  } else {
    std::memmove(target, local, w.length);
  }
  return {IBV_WC_SUCCESS};
}

void execute(Fabric& f, const Work& w) {
  SoftQp& qp = *w.qp;
  auto& cq = send_cq_of(qp);
  const Outcome outcome = transfer(f, qp, w);
  if (outcome.status == IBV_WC_SUCCESS) {
    if (w.signaled) push_completion(f, cq, make_cqe(qp, w, outcome.status, w.length));
    return;
  }
  // Errors complete whether signaled or not, and stop the QP.
  push_completion(f, cq, make_cqe(qp, w, outcome.status, 0));
  enter_error(f, qp);
  if (SoftQp* responder = outcome.rejected_by) {
    enter_error(f, *responder);
    if (outcome.event) raise_qp_event(f, *responder, *outcome.event);
  }
}

/// How long a requester retries a request nobody answers: one local ACK
/// timeout (4.096 us * 2^timeout) per try, retry_cnt retries. Timeout 0 means
/// no timeout: it waits forever.
std::optional<Clock::duration> retry_window(const SoftQp& qp) {
  if (qp.timeout == 0) return std::nullopt;
  const auto ack_timeout = std::chrono::nanoseconds(4096) * (std::int64_t{1} << qp.timeout);
  return ack_timeout * (qp.retry_cnt + 1);
}

/// The RNR NAK timer a responder's min_rnr_timer asks for (the InfiniBand
/// spec's table: code 0 is the longest, 655.36 ms), in microseconds.
std::chrono::microseconds rnr_timer(std::uint8_t code) {
  static constexpr std::uint32_t table[32] = {
      655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,    320,
      480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240,  15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::chrono::microseconds(table[code & 31U]);
}

/// How long a requester sits out RNR NAKs: rnr_retry timers of the
/// responder's length; rnr_retry 7 means forever.
std::optional<Clock::duration> rnr_window(const SoftQp& requester, const SoftQp& responder) {
  if (requester.rnr_retry == 7) return std::nullopt;
  return rnr_timer(responder.min_rnr_timer) * requester.rnr_retry;
}

/// Why a work request cannot execute yet: its responder does not answer
/// (transport retries), or answers with an RNR NAK (no receive posted for a
/// request that needs one).
enum class Wait { none, transport, rnr };

Wait wait_of(Fabric& f, const Work& w, SoftQp*& responder) {
  responder = responder_for(f, *w.qp);
  if (responder == nullptr) return Wait::transport;
  if (consumes_receive(w.opcode) && responder->receives.empty()) return Wait::rnr;
  return Wait::none;
}

/// The next work request to execute: the first, in post order, whose QP has
/// no earlier request still waiting for an answer, and that is answered or
/// out of retries. `wake` gets the earliest end of a retry window.
std::deque<Work>::iterator next_runnable(Fabric& f, Clock::time_point now, std::optional<Clock::time_point>& wake) {
  std::unordered_set<const SoftQp*> waiting;
  for (auto it = f.work.begin(); it != f.work.end(); ++it) {
    if (waiting.contains(it->qp)) continue;
    SoftQp* responder = nullptr;
    const Wait wait = wait_of(f, *it, responder);
    if (wait == Wait::none) return it;
    if (!it->retry_until) {
      const auto window = wait == Wait::rnr ? rnr_window(*it->qp, *responder) : retry_window(*it->qp);
      if (wait == Wait::rnr && is_current(f, *it->qp)) ++f.rnr_naks;
      it->retry_until = window ? now + *window : Clock::time_point::max();
    }
    if (now >= *it->retry_until) return it;
    waiting.insert(it->qp);
    if (*it->retry_until != Clock::time_point::max()) wake = std::min(wake.value_or(*it->retry_until), *it->retry_until);
  }
  return f.work.end();
}

void Fabric::run_worker() {
  Lock lock(mu);
  for (;;) {
    work_cv.wait(lock, [this] { return !held && !work.empty(); });
    if (delay.count() > 0) {
      // The request stays queued (and counted) while it waits.
      const auto until = Clock::now() + delay;
      const auto seen = generation;
      work_cv.wait_until(lock, until, [&] { return generation != seen; });
      if (held || work.empty() || generation != seen) continue;
    }
    std::optional<Clock::time_point> wake;
    const auto next = next_runnable(*this, Clock::now(), wake);
    if (next == work.end()) {
      // Everything queued waits for an answer: until a retry window ends, or
      // something changes (a QP connects, new work, a reset).
      if (wake) {
        work_cv.wait_until(lock, *wake);
      } else {
        work_cv.wait(lock);
      }
      continue;
    }
    const Work w = *next;
    work.erase(next);
    execute(*this, w);
    changed.notify_all();
  }
}

// ===========================================================================
// Async events
// ===========================================================================

/// The QP or CQ an event names, by its async-event counters and context;
/// empty for port and device events (or an object already gone).
struct EventOwner {
  std::size_t* read = nullptr;
  std::size_t* acked = nullptr;
  const void* context = nullptr;
};

EventOwner owner_of(Fabric& f, const ibv_async_event& e) {
  const void* object = event_object(e);
  if (object == nullptr) return {};
  if (const auto it = f.qps.find(object); it != f.qps.end()) {
    return {&it->second->async_read, &it->second->async_acked, it->second->context};
  }
  if (const auto it = f.cqs.find(object); it != f.cqs.end()) {
    return {&it->second->async_read, &it->second->async_acked, it->second->context};
  }
  return {};
}

int sv_get_async_event(ibv_context* context, ibv_async_event* event) {
  return read_event("ibv_get_async_event", &Fabric::contexts, context, event != nullptr,
                    [&](Fabric& f, SoftContext& c, const ibv_async_event& e) {
                      *event = e;
                      ++c.async_read;
                      if (const EventOwner owner = owner_of(f, e); owner.read != nullptr) {
                        ++*owner.read;
                      } else {
                        f.unbound_events[e.event_type].push_back(context);
                      }
                    });
}

void sv_ack_async_event(ibv_async_event* event) {
  auto [f, lock] = lock_fabric();
  if (event == nullptr) return misuse(f, "ibv_ack_async_event: null event");
  const void* context = nullptr;
  if (const EventOwner owner = owner_of(f, *event); owner.read != nullptr) {
    if (*owner.acked == *owner.read) return misuse(f, "ibv_ack_async_event: no unacknowledged event for its object");
    ++*owner.acked;
    context = owner.context;
  } else {
    auto& readers = f.unbound_events[event->event_type];
    if (readers.empty()) return misuse(f, "ibv_ack_async_event: no such event was read");
    context = readers.front();
    readers.pop_front();
  }
  if (const auto it = f.contexts.find(context); it != f.contexts.end()) ++it->second->async_acked;
}

// ===========================================================================
// Strings
// ===========================================================================

const char* sv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    case IBV_WC_TM_ERR: return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE: return "TM software rendezvous";
  }
  return "unknown";
}

const char* sv_event_type_str(ibv_event_type event) {
  switch (event) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    case IBV_EVENT_WQ_FATAL: return "WQ fatal";
  }
  return "unknown";
}

std::shared_ptr<const verbs::IbvApi> make_table() {
  auto api = std::make_shared<verbs::IbvApi>();
  api->origin = "soft";
  api->get_device_list = sv_get_device_list;
  api->free_device_list = sv_free_device_list;
  api->get_device_name = sv_get_device_name;
  api->open_device = sv_open_device;
  api->close_device = sv_close_device;
  api->query_device = sv_query_device;
  api->query_port = sv_query_port;
  api->query_gid = sv_query_gid;
  api->query_gid_ex = sv_query_gid_ex;
  api->alloc_pd = sv_alloc_pd;
  api->dealloc_pd = sv_dealloc_pd;
  api->reg_mr = sv_reg_mr;
  api->reg_mr_iova2 = sv_reg_mr_iova2;
  api->dereg_mr = sv_dereg_mr;
  api->create_comp_channel = sv_create_comp_channel;
  api->destroy_comp_channel = sv_destroy_comp_channel;
  api->create_cq = sv_create_cq;
  api->destroy_cq = sv_destroy_cq;
  api->req_notify_cq = sv_req_notify_cq;
  api->get_cq_event = sv_get_cq_event;
  api->ack_cq_events = sv_ack_cq_events;
  api->poll_cq = sv_poll_cq;
  api->create_qp = sv_create_qp;
  api->modify_qp = sv_modify_qp;
  api->destroy_qp = sv_destroy_qp;
  api->post_send = sv_post_send;
  api->post_recv = sv_post_recv;
  api->get_async_event = sv_get_async_event;
  api->ack_async_event = sv_ack_async_event;
  api->wc_status_str = sv_wc_status_str;
  api->event_type_str = sv_event_type_str;
  return api;
}

/// Runs `fn(fabric)` under the fabric lock and returns its result.
template <class Fn>
auto locked(Fn&& fn) {
  auto [f, lock] = lock_fabric();
  return fn(f);
}

/// A counter (or other field) of the fabric, read under its lock.
template <class T>
T read_field(T Fabric::*field) {
  return locked([field](Fabric& f) { return f.*field; });
}

/// How many objects of one kind the current generation holds.
template <class Soft>
std::size_t count_live(Live<Soft> Fabric::*live) {
  return locked([live](Fabric& f) { return count_current(f, f.*live); });
}

/// Events read for the current generation's objects of one kind and not yet
/// acknowledged, by the object's own read and acknowledged counters.
template <class Soft>
std::size_t count_unacked(Live<Soft> Fabric::*live, std::size_t Soft::*read, std::size_t Soft::*acked) {
  return locked([&](Fabric& f) {
    std::size_t n = 0;
    for (const auto& [handle, object] : f.*live) {
      if (is_current(f, *object)) n += (*object).*read - (*object).*acked;
    }
    return n;
  });
}

}  // namespace

// ===========================================================================
// SoftVerbs: the test-facing side
// ===========================================================================

SoftVerbs& SoftVerbs::instance() {
  static auto* instance = [] {
    fabric();  // starts the worker
    return new SoftVerbs;
  }();
  return *instance;
}

std::shared_ptr<const verbs::IbvApi> SoftVerbs::api() const {
  static const auto table = make_table();
  return table;
}

void SoftVerbs::reset(const SoftVerbsConfig& config) {
  locked([&](Fabric& f) {
    ++f.generation;
    f.config = config;
    // Leftover QPs stop: their queued work flushes without touching memory
    // that the test which posted it may have freed, and so does anything
    // posted on them later.
    for (auto& [handle, qp] : f.qps) enter_error(f, *qp);
    f.held = false;
    f.delay = {};
    f.fail_reg_mr = 0;
    f.fail_completion.reset();
    f.posted = f.post_calls = f.overruns = f.max_outstanding = f.cq_overruns = f.misuses = 0;
    f.receives_posted = f.rnr_naks = 0;
    f.last_misuse.clear();
    f.work_cv.notify_all();
  });
}

void SoftVerbs::fail_next_reg_mr(int err) {
  locked([&](Fabric& f) { f.fail_reg_mr = err; });
}

void SoftVerbs::fail_next_completion(ibv_wc_status status) {
  locked([&](Fabric& f) {
    if (status == IBV_WC_SUCCESS) {
      f.fail_completion.reset();
    } else {
      f.fail_completion = status;
    }
  });
}

void SoftVerbs::move_qps_to_error() {
  locked([](Fabric& f) {
    for (auto& [handle, qp] : f.qps) {
      if (!is_current(f, *qp)) continue;
      enter_error(f, *qp);
      raise_qp_event(f, *qp, IBV_EVENT_QP_FATAL);
    }
    f.changed.notify_all();
  });
}

void SoftVerbs::raise_async_event(ibv_event_type type) {
  locked([type](Fabric& f) {
    for (auto& [handle, context] : f.contexts) {
      if (!is_current(f, *context)) continue;
      ibv_async_event event{};
      event.event_type = type;
      if (is_qp_event(type)) {
        for (auto& [h, qp] : f.qps) {
          event.element.qp = qp.get();
          if (qp->context == context.get()) push_async_event(*context, event);
        }
      } else if (type == IBV_EVENT_CQ_ERR) {
        for (auto& [h, cq] : f.cqs) {
          event.element.cq = cq.get();
          if (cq->context == context.get()) push_async_event(*context, event);
        }
      } else if (is_port_event(type)) {
        event.element.port_num = kPort;
        push_async_event(*context, event);
      } else if (type == IBV_EVENT_DEVICE_FATAL) {
        push_async_event(*context, event);
      }
    }
  });
}

void SoftVerbs::hold_work() {
  locked([](Fabric& f) { f.held = true; });
}

void SoftVerbs::release_work() {
  locked([](Fabric& f) {
    f.held = false;
    f.work_cv.notify_all();
  });
}

void SoftVerbs::set_work_delay(std::chrono::nanoseconds delay) {
  locked([delay](Fabric& f) { f.delay = delay; });
}

std::size_t SoftVerbs::work_requests_posted() const { return read_field(&Fabric::posted); }
std::size_t SoftVerbs::post_send_calls() const { return read_field(&Fabric::post_calls); }
std::size_t SoftVerbs::max_outstanding() const { return read_field(&Fabric::max_outstanding); }
std::size_t SoftVerbs::overruns() const { return read_field(&Fabric::overruns); }
std::size_t SoftVerbs::receives_posted() const { return read_field(&Fabric::receives_posted); }
std::size_t SoftVerbs::rnr_naks() const { return read_field(&Fabric::rnr_naks); }
std::size_t SoftVerbs::cq_overruns() const { return read_field(&Fabric::cq_overruns); }
std::size_t SoftVerbs::misuses() const { return read_field(&Fabric::misuses); }
std::string SoftVerbs::last_misuse() const { return read_field(&Fabric::last_misuse); }
std::size_t SoftVerbs::live_mrs() const { return count_live(&Fabric::mrs); }
std::size_t SoftVerbs::live_qps() const { return count_live(&Fabric::qps); }
std::size_t SoftVerbs::live_pds() const { return count_live(&Fabric::pds); }
std::size_t SoftVerbs::live_cqs() const { return count_live(&Fabric::cqs); }
std::size_t SoftVerbs::live_comp_channels() const { return count_live(&Fabric::channels); }
std::size_t SoftVerbs::open_contexts() const { return count_live(&Fabric::contexts); }
std::size_t SoftVerbs::live_device_lists() const {
  return locked([](Fabric& f) { return f.device_lists.size(); });
}
std::size_t SoftVerbs::work_requests_executing_or_queued() const {
  return locked([](Fabric& f) {
    return static_cast<std::size_t>(
        std::count_if(f.work.begin(), f.work.end(), [&](const Work& w) { return is_current(f, *w.qp); }));
  });
}
std::size_t SoftVerbs::unacked_cq_events() const {
  return count_unacked(&Fabric::cqs, &SoftCq::events_read, &SoftCq::events_acked);
}
std::size_t SoftVerbs::unacked_async_events() const {
  return count_unacked(&Fabric::contexts, &SoftContext::async_read, &SoftContext::async_acked);
}

std::string SoftVerbs::leftovers() const {
  std::string out;
  const std::pair<const char*, std::size_t> kinds[] = {
      {"qps", live_qps()},           {"mrs", live_mrs()},      {"cqs", live_cqs()},
      {"comp channels", live_comp_channels()}, {"pds", live_pds()}, {"contexts", open_contexts()},
      {"device lists", live_device_lists()}};
  for (const auto& [name, count] : kinds) {
    if (count == 0) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(count) + " " + name;
  }
  return out;
}

std::optional<std::uint32_t> SoftVerbs::rkey_of(const void* addr) const {
  return locked([addr](Fabric& f) -> std::optional<std::uint32_t> {
    const auto target = reinterpret_cast<std::uintptr_t>(addr);
    for (const auto& [handle, mr] : f.mrs) {
      const auto start = reinterpret_cast<std::uintptr_t>(mr->addr);
      if (target >= start && target - start < mr->length) return mr->rkey;
    }
    return std::nullopt;
  });
}

bool SoftVerbs::wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) const {
  auto& f = fabric();
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    // Re-evaluated on every provider change, and at least every millisecond
    // for conditions that depend on state outside the provider.
    Lock lock(f.mu);
    f.changed.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(1)));
  }
}

}  // namespace corma::testing
