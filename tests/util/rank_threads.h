// Multi-rank tests in one process: run W ranks as threads, and build a group of W
// GlooCollectives over one InMemoryStore (as Gloo's own tests do).
//
//   absl::StatusOr<std::vector<std::unique_ptr<Collective>>> group = MakeGlooGroup(3);
//   ASSERT_OK(group);
//   RunRanks(3, [&](int rank) { EXPECT_OK((*group)[rank]->Barrier(absl::Seconds(5))); });
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/collective/collective.h"
#include "server/collective/gloo/gloo_collective.h"
#include "server/collective/in_memory_store.h"

namespace orthoserve::testing {

// Runs body(0) .. body(world-1), each on its own std::thread, and returns when all have
// returned. GoogleTest assertions inside `body` are safe (they record failures per test);
// an ASSERT_* returns from that rank's body only. An exception escaping a body is rethrown
// here after every thread has been joined.
inline void RunRanks(int world, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world);
  threads.reserve(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&body, &errors, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// Builds a group of `world` GlooCollectives on loopback: element r is rank r. Every rank joins
// from its own thread (Gloo's rendezvous blocks until all ranks arrive) over one InMemoryStore
// that lives only for the call. `timeout` bounds the rendezvous. Returns the first rank's error
// if any rank fails to join.
inline absl::StatusOr<std::vector<std::unique_ptr<Collective>>> MakeGlooGroup(
    int world, absl::Duration timeout = absl::Seconds(30)) {
  InMemoryStore store;
  std::vector<absl::StatusOr<std::unique_ptr<GlooCollective>>> made(world);  // UNKNOWN until set
  RunRanks(world, [&](int rank) {
    GlooCollective::Options options;
    options.rank = rank;
    options.world = world;
    options.store = &store;
    options.prefix = "test";
    options.timeout = timeout;
    made[rank] = GlooCollective::Create(options);
  });
  std::vector<std::unique_ptr<Collective>> group;
  for (int rank = 0; rank < world; ++rank) {
    if (!made[rank].ok()) {
      const absl::Status& status = made[rank].status();
      return absl::Status(status.code(), absl::StrCat("rank ", rank, ": ", status.message()));
    }
    group.push_back(*std::move(made[rank]));
  }
  return group;
}

}  // namespace orthoserve::testing
