// MatrixInput over a float vector, shared by the client tests.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "client/cpp/client.h"

namespace orthoserve::client::testing_util {

// A whole fp32 matrix `name` of `shape` viewing `data` (which must outlive the input), with the
// default options.
inline MatrixInput F32Input(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& data) {
  MatrixInput in;
  in.name = name;
  in.shape = std::move(shape);
  in.data = data.data();
  in.bytes = data.size() * sizeof(float);
  return in;
}

}  // namespace orthoserve::client::testing_util
