// Helpers for the in-process service tests: a Server on 127.0.0.1:0, stubs, request builders
// and the same-backend reference every result is compared with.
#pragma once

#include <map>
#include <memory>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/ns_options.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"
#include "proto/convert/ns_options_proto.h"
#include "server/app/server.h"
#include "server/engine/cpu/cpu_backend.h"
#include "server/engine/newton_schulz.h"
#include "tests/util/status_matchers.h"

namespace orthoserve::testing {

inline ServerOptions TestServerOptions() {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_address = "";
  o.workers = 2;
  o.service.rendezvous_timeout = absl::Seconds(3);
  return o;
}

inline std::unique_ptr<v1::Orthogonalizer::Stub> StubFor(const Server& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return v1::Orthogonalizer::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials(), args));
}

inline std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& x : m) x = dist(rng);
  return m;
}

inline std::string Bytes(const std::vector<float>& values, DType dtype) {
  std::string out(values.size() * ElementSize(dtype), '\0');
  ConvertFromF32(dtype, values.data(), values.size(), out.data());
  return out;
}

inline v1::MatrixSpec Spec(const std::string& name, std::vector<int64_t> shape, DType dtype, const NsOptions& options) {
  v1::MatrixSpec spec;
  spec.set_name(name);
  for (int64_t d : shape) spec.add_shape(d);
  spec.set_dtype(DTypeToProto(dtype));
  *spec.mutable_options() = NsOptionsToProto(options);
  return spec;
}

// The engine's answer for the same input on a fresh one-thread CPU backend, in `out_dtype`.
inline std::string Reference(const std::string& in, Matrix2d shape, DType in_dtype, DType out_dtype,
                             const NsOptions& options) {
  auto backend = CpuBackend::Create(CpuBackend::Options{});
  EXPECT_TRUE(backend.ok());
  std::string out(static_cast<size_t>(shape.numel()) * ElementSize(out_dtype), '\0');
  MatrixJob job{"ref", shape, shape, in_dtype, in.data(), out_dtype, out.data(), &options};
  EXPECT_OK(OrthogonalizeOne(**backend, job));
  return out;
}

}  // namespace orthoserve::testing

namespace orthoserve::testing {

struct StreamOutcome {
  grpc::Status status;
  std::map<int, v1::MatrixResult> results;  // By index.
  std::map<int, std::string> data;          // Reassembled result bytes by index.
  std::vector<int> order;                   // Indices in the order results arrived.
  size_t largest_chunk = 0;                 // Bytes of the largest result DataChunk.
  bool summary = false;
  v1::StepSummary step_summary;
};

inline v1::StreamRequest HeaderMessage(int num_matrices, int rank = 0, int world = 1, const std::string& job = "",
                                       int64_t step = 0, const std::string& group = "g",
                                       const std::string& run_id = "run-a") {
  v1::StreamRequest m;
  v1::StepHeader* h = m.mutable_header();
  h->set_num_matrices(num_matrices);
  h->set_rank(rank);
  h->set_world(world);
  h->set_job(job);
  h->set_group(job.empty() ? "" : group);
  h->set_step(step);
  if (world > 1) h->set_run_id(run_id);
  return m;
}

// Appends the spec and its data in chunks of `chunk` bytes.
inline void AppendMatrix(std::vector<v1::StreamRequest>& out, int index, const v1::MatrixSpec& spec,
                         const std::string& data, size_t chunk = 1 << 16) {
  v1::StreamRequest s;
  *s.mutable_spec() = spec;
  out.push_back(s);
  for (size_t off = 0; off < data.size(); off += chunk) {
    v1::StreamRequest c;
    c.mutable_chunk()->set_index(index);
    c.mutable_chunk()->set_data(data.substr(off, chunk));
    out.push_back(c);
  }
}

inline v1::StreamRequest EndMessage() {
  v1::StreamRequest m;
  m.mutable_end();
  return m;
}

// Sends `messages` on one stream (writing on a separate thread) and collects every response.
inline StreamOutcome RunStream(v1::Orthogonalizer::Stub& stub, const std::vector<v1::StreamRequest>& messages,
                               grpc::ClientContext* context = nullptr) {
  grpc::ClientContext local;
  grpc::ClientContext* ctx = context != nullptr ? context : &local;
  auto stream = stub.OrthogonalizeStream(ctx);
  std::thread writer([&] {
    for (const v1::StreamRequest& m : messages) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
  });
  StreamOutcome out;
  v1::StreamResponse response;
  while (stream->Read(&response)) {
    if (response.has_result()) {
      out.results[response.result().index()] = response.result();
      out.order.push_back(response.result().index());
      out.data[response.result().index()];
    } else if (response.has_chunk()) {
      out.data[response.chunk().index()] += response.chunk().data();
      out.largest_chunk = std::max(out.largest_chunk, response.chunk().data().size());
    } else if (response.has_summary()) {
      out.summary = true;
      out.step_summary = response.summary();
    }
  }
  writer.join();
  out.status = stream->Finish();
  return out;
}

}  // namespace orthoserve::testing
