// A StepSink that records what a step hands it: each matrix's status and result bytes, and how
// the step ended (once; a second Finished or a Result after it fails the test).
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/step/step.h"

namespace orthoserve {

class RecordingSink final : public StepSink {
 public:
  struct Recorded {
    absl::Status status;
    Block block;
    std::string data;
  };

  void Result(int index, const MatrixPlan& plan, const Block& block, const absl::Status& status,
              absl::string_view data, std::shared_ptr<const void> owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(finished_.HasBeenNotified()) << "a result after Finished";
    EXPECT_EQ(results_.count(index), 0u) << "matrix " << index << " answered twice";
    results_[index] = Recorded{status, block, std::string(data)};
  }
  void Finished(StepEnd end) override {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_FALSE(finished_.HasBeenNotified()) << "Finished twice";
    end_ = std::move(end);
    finished_.Notify();
  }

  // Waits up to `timeout` for Finished; false if it did not come.
  bool WaitFinished(absl::Duration timeout = absl::Seconds(10)) {
    return finished_.WaitForNotificationWithTimeout(timeout);
  }
  bool finished() const { return finished_.HasBeenNotified(); }
  StepEnd end() {
    std::lock_guard<std::mutex> lock(mu_);
    return end_;
  }
  std::map<int, Recorded> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::map<int, Recorded> results_;
  StepEnd end_;
  absl::Notification finished_;
};

}  // namespace orthoserve
