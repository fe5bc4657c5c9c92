// Acquires (single and batched) and windows as jobs of the owner's fair
// queue: names are looked up and answered a turn at a time, registrations
// run in the background, and a request is answered once all of it is done.
#include "rendezvous/owner/owner_state.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <functional>
#include <list>

namespace corma {

namespace asio = boost::asio;
using namespace rendezvous;

namespace {

/// What a request is answered when the code answering it throws (a
/// resolver, say): answered all the same, since the connection waits for
/// every answer it owes.
ErrorReply failed_to_answer(const std::exception& e) {
  return error_reply(Error{errc::backend, std::string("the owner failed to answer: ") + e.what()});
}

/// Writes one answer without making the job wait for the connection.
void send(asio::any_io_executor executor, AnswerQueue& answers, Frame frame) {
  asio::co_spawn(executor, answers.answer(std::move(frame)), asio::detached);
}

/// An `acquire` (one name) or an `acquire_many` (each name answered as an
/// acquire would be, in one `granted`).
class AcquireJob final : public Job, public std::enable_shared_from_this<AcquireJob> {
 public:
  using State = Owner::State;

  AcquireJob(State& state, State::Session session, AnswerQueue& answers, std::uint64_t request_id, bool batch,
             bool wants_rdma, std::vector<std::string> names)
      : state_(state.shared_from_this()),
        session_(session),
        answers_(answers),
        request_id_(request_id),
        batch_(batch),
        wants_rdma_(wants_rdma),
        names_(std::move(names)),
        grants_(names_.size()) {
    answers_.hold(names_.size());
  }

  std::size_t run(std::size_t budget) override {
    std::size_t done = 0;
    for (; done < budget && next_ < names_.size(); ++done) {
      const auto at = next_++;
      Acquire request{std::move(names_[at]), wants_rdma_};
      State::PreparedAcquire prepared;
      try {
        prepared = state_->prepare_acquire(session_.id, session_.rdma_peer, batch_ || session_.version2, request);
      } catch (const std::exception& e) {
        prepared = failed_to_answer(e);
      }
      if (auto* grant = std::get_if<Grant>(&prepared)) {
        grants_[at] = std::move(*grant);
        continue;
      }
      ++registering_;
      auto& abandoned = lookups_abandoned_.emplace_back();
      asio::co_spawn(state_->executor,
                     register_one(shared_from_this(), at, std::get<State::PendingAcquire>(std::move(prepared)),
                                  abandoned.slot()),
                     asio::detached);
    }
    answer_when_done();
    return done;
  }

  [[nodiscard]] bool finished() const override { return next_ == names_.size() || abandoned_; }

  void abandon() override {
    abandoned_ = true;
    // Look-ups still under way (a cold file being read) are given up: the
    // connection waits for this job, and nobody will read its answer.
    for (auto& lookup : lookups_abandoned_) lookup.emit(asio::cancellation_type::terminal);
    answer_when_done();
  }

 private:
  static asio::awaitable<void> register_one(std::shared_ptr<AcquireJob> self, std::size_t at,
                                            State::PendingAcquire pending, asio::cancellation_slot abandoned) {
    try {
      self->grants_[at] = co_await self->state_->complete_acquire(std::move(pending), abandoned);
    } catch (const std::exception& e) {
      self->grants_[at] = failed_to_answer(e);
    }
    --self->registering_;
    self->answer_when_done();
  }

  void answer_when_done() {
    if (answered_ || registering_ > 0 || !finished()) return;
    answered_ = true;
    answers_.give_back(names_.size());
    if (abandoned_) {
      answers_.forgo();
      return;
    }
    Message reply;
    if (batch_) {
      reply = Granted{std::move(grants_)};
    } else {
      reply = std::visit([](auto&& grant) { return Message{std::move(grant)}; }, std::move(grants_.front()));
    }
    send(state_->executor, answers_, Frame{request_id_, std::move(reply)});
  }

  std::shared_ptr<State> state_;
  State::Session session_;
  AnswerQueue& answers_;  // the session waits for this job's answer before it goes
  std::uint64_t request_id_;
  bool batch_;
  bool wants_rdma_;
  std::vector<std::string> names_;
  std::vector<Grant> grants_;
  std::size_t next_ = 0;         // the next name to look up
  std::size_t registering_ = 0;  // names whose registration is under way
  /// One per name being registered: emitted when the job is abandoned.
  std::list<asio::cancellation_signal> lookups_abandoned_;
  bool abandoned_ = false;
  bool answered_ = false;
};

/// A `next_window`: one registration, run in the background once its turn comes.
class WindowJob final : public Job {
 public:
  using State = Owner::State;

  WindowJob(State& state, State::Session session, AnswerQueue& answers, std::uint64_t request_id, NextWindow request)
      : state_(state.shared_from_this()),
        session_(session),
        answers_(answers),
        request_id_(request_id),
        request_(request) {}

  std::size_t run(std::size_t) override {
    started_ = true;
    asio::co_spawn(state_->executor, move_window(state_, session_.id, answers_, request_id_, request_),
                   asio::detached);
    return 1;
  }

  [[nodiscard]] bool finished() const override { return started_; }

  void abandon() override {
    if (!started_) answers_.forgo();
  }

 private:
  static asio::awaitable<void> move_window(std::shared_ptr<State> state, std::uint64_t session, AnswerQueue& answers,
                                           std::uint64_t request_id, NextWindow request) {
    Message reply;
    try {
      reply = co_await state->next_window(session, request);
    } catch (const std::exception& e) {
      reply = failed_to_answer(e);
    }
    Frame response{request_id, std::move(reply)};
    co_await answers.answer(std::move(response));
  }

  std::shared_ptr<State> state_;
  State::Session session_;
  AnswerQueue& answers_;
  std::uint64_t request_id_;
  NextWindow request_;
  bool started_ = false;
};

}  // namespace

void Owner::State::queue_request(const Session& session, AnswerQueue& answers, Frame frame) {
  std::shared_ptr<Job> job;
  if (auto* single = std::get_if<Acquire>(&frame.message)) {
    std::vector<std::string> names;
    names.push_back(std::move(single->name));
    job = std::make_shared<AcquireJob>(*this, session, answers, frame.request_id, false, single->wants_rdma,
                                       std::move(names));
  } else if (auto* many = std::get_if<AcquireMany>(&frame.message)) {
    job = std::make_shared<AcquireJob>(*this, session, answers, frame.request_id, true, many->wants_rdma,
                                       std::move(many->names));
  } else {
    job = std::make_shared<WindowJob>(*this, session, answers, frame.request_id, std::get<NextWindow>(frame.message));
  }
  work.push(session.id, std::move(job));
}

asio::awaitable<void> Owner::State::dispatch() {
  auto self = shared_from_this();
  // Named, not temporaries in the co_await (g++ 12 destroys those twice).
  std::function<bool()> stopping = [this] { return draining; };
  std::function<void()> before_turn = [this] {
    if (refresh_resolver) refresh_resolver();
  };
  co_await work.run(std::move(stopping), std::move(before_turn));
}

}  // namespace corma
