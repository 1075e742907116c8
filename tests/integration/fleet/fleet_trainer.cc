// A trainer that dies mid-step: it opens a group step as one trainer rank, sends its header,
// its spec and half of its block's bytes, prints "sent" and then waits to be killed. Used by
// fleet_test to kill a real trainer process in the middle of a step.
//
//   fleet_trainer SERVER JOB STEP RANK WORLD ROWS COLS
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "grpcpp/create_channel.h"
#include "orthoserve/v1/orthogonalizer.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: fleet_trainer SERVER JOB STEP RANK WORLD ROWS COLS\n";
    return 2;
  }
  const std::string server = argv[1];
  const int64_t step = std::atoll(argv[3]);
  const int rank = std::atoi(argv[4]);
  const int world = std::atoi(argv[5]);
  const int64_t rows = std::atoll(argv[6]);
  const int64_t cols = std::atoll(argv[7]);
  auto stub = orthoserve::v1::Orthogonalizer::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->OrthogonalizeStream(&context);
  orthoserve::v1::StreamRequest header;
  header.mutable_header()->set_job(argv[2]);
  header.mutable_header()->set_group("g");
  header.mutable_header()->set_step(step);
  header.mutable_header()->set_rank(rank);
  header.mutable_header()->set_world(world);
  header.mutable_header()->set_num_matrices(1);
  header.mutable_header()->set_run_id(std::string("run-") + argv[2]);
  orthoserve::v1::StreamRequest spec;
  spec.mutable_spec()->set_name("killed");
  spec.mutable_spec()->add_shape(rows);
  spec.mutable_spec()->add_shape(cols);
  spec.mutable_spec()->set_dtype(orthoserve::v1::DTYPE_FP32);
  orthoserve::v1::Block* block = spec.mutable_spec()->mutable_block();
  block->set_row_offset(0);
  block->set_rows(rows);
  block->set_cols(cols);
  orthoserve::v1::StreamRequest chunk;
  chunk.mutable_chunk()->set_index(0);
  chunk.mutable_chunk()->set_data(std::string(static_cast<size_t>(rows * cols * 2), '\0'));
  if (!stream->Write(header) || !stream->Write(spec) || !stream->Write(chunk)) {
    std::cerr << "fleet_trainer: the stream broke\n";
    return 1;
  }
  std::cout << "sent" << std::endl;
  std::this_thread::sleep_for(std::chrono::minutes(5));
  return 0;
}
