#include "rendezvous/owner/fair_queue.hpp"

#include <algorithm>

namespace corma::rendezvous {

void FairQueue::push(std::uint64_t connection, std::shared_ptr<Job> job) {
  auto& queue = queues_[connection];
  if (queue.jobs.empty()) {
    queue.served = std::max(queue.served, clock_ - std::min(clock_, std::uint64_t{units_per_go}));
    ready_.emplace(queue.served, connection);
  }
  queue.jobs.push_back(std::move(job));
}

std::size_t FairQueue::run(std::size_t budget) {
  std::size_t done = 0;
  while (done < budget && !ready_.empty()) {
    const auto [served, connection] = *ready_.begin();
    ready_.erase(ready_.begin());
    clock_ = served;
    auto& queue = queues_.at(connection);
    const auto job = queue.jobs.front();
    const auto units = std::max<std::size_t>(job->run(std::min(budget - done, units_per_go)), 1);
    done += units;
    queue.served += units;
    const bool job_done = job->finished();
    if (job_done) {
      queue.jobs.pop_front();
      remember_ran(connection, job);
    }
    if (queue.jobs.empty()) {
      queues_.erase(connection);  // it starts again from the clock
    } else {
      ready_.emplace(queue.served, connection);
    }
    if (job_done && on_job_done) on_job_done(connection);
  }
  return done;
}

std::size_t FairQueue::queued(std::uint64_t connection) const {
  auto it = queues_.find(connection);
  return it == queues_.end() ? 0 : it->second.jobs.size();
}

void FairQueue::remember_ran(std::uint64_t connection, const std::shared_ptr<Job>& job) {
  auto& ran = ran_[connection];
  ran.jobs.push_back(job);
  if (ran.jobs.size() >= std::max<std::size_t>(2 * ran.after_sweep, 16)) {
    std::erase_if(ran.jobs, [](const std::weak_ptr<Job>& j) { return j.expired(); });
    ran.after_sweep = ran.jobs.size();
  }
}

void FairQueue::drop(std::uint64_t connection) {
  std::vector<std::shared_ptr<Job>> jobs;
  if (auto it = queues_.find(connection); it != queues_.end()) {
    jobs.assign(it->second.jobs.begin(), it->second.jobs.end());
    ready_.erase({it->second.served, connection});
    queues_.erase(it);
  }
  if (auto it = ran_.find(connection); it != ran_.end()) {
    for (const auto& weak : it->second.jobs) {
      if (auto job = weak.lock()) jobs.push_back(std::move(job));
    }
    ran_.erase(it);
  }
  for (auto& job : jobs) job->abandon();
}

}  // namespace corma::rendezvous
