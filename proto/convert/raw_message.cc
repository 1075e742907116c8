// Implementation of proto/convert/raw_message.h.
#include "proto/convert/raw_message.h"

#include "grpcpp/support/slice.h"

namespace orthoserve {

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace orthoserve
