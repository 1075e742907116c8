// The fixture of the etcd client's tests: a fresh single-member etcd per test and a client of
// it. A missing etcd fails the test (naming the package), never skips it.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/etcd/etcd_client.h"
#include "tests/unit/etcd/etcd_process.h"

namespace orthoserve::testing {

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start(1);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    client_ = NewClient();
    ASSERT_NE(client_, nullptr);
  }

  // A client of the cluster with short timeouts.
  std::unique_ptr<etcd::EtcdClient> NewClient() {
    etcd::EtcdOptions options;
    options.endpoints = cluster_->endpoints();
    options.dial_timeout = absl::Seconds(1);
    options.call_timeout = absl::Seconds(3);
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<etcd::EtcdClient> client_;
};

}  // namespace orthoserve::testing
