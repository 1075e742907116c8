// The run id of a trainer process's group steps (StepHeader.run_id): the ranks of one run share
// it, and no other run has it, so that the fleet never puts two runs' blocks into one step; and
// the call ids of calls that name shared-memory slices.
#pragma once

#include <string>

namespace orthoserve::client {

// This process's default run id: $ORTHOSERVE_RUN_ID when set and non-empty, else
// $TORCHELASTIC_RUN_ID (torchrun gives every rank of a job the same one), else a random id made
// once per process. A random id is unique to the process, so the ranks of a run that are separate
// processes must be given a shared id (one of the variables, or StepOptions::run_id /
// GroupClient::Options::run_id); otherwise their steps never meet and end in a rendezvous timeout.
// Thread-safe; the same value for the life of the process.
const std::string& DefaultRunId();

// A fresh random call id (32 hex digits, 128 bits) for StepHeader.call_id /
// OrthogonalizeRequest.call_id: a call that names shared-memory slices carries one so that, when it
// fails, the client can fence it (SharedMemory.FenceCall) before the slices are used again.
// Thread-safe.
std::string NewCallId();

}  // namespace orthoserve::client
