// Implementation of server/engine/newton_schulz.h.
#include "server/engine/newton_schulz.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/message_text.h"
#include "common/status.h"

namespace orthoserve {
namespace {

// The copy between a matrix of `rows` rows of `cols` elements (rows divisible by q+k+v) and its
// part `part` (0 = Q, 1 = K, 2 = V): the part's rows of every query group, gathered in group order
// (`gather`), or written back to their interleaved rows (the inverse). One 2-D copy: a row of it
// is one group's rows of the part.
Copy2dArgs QkvPartCopy(const void* matrix, void* part_data, int64_t rows, int64_t cols, size_t elem,
                       const std::vector<int64_t>& split, int part, bool gather, MemorySpace space) {
  const int64_t group = split[0] + split[1] + split[2];
  const int64_t first = part == 0 ? 0 : (part == 1 ? split[0] : split[0] + split[1]);
  const size_t row_bytes = static_cast<size_t>(cols) * elem;
  const size_t part_bytes = static_cast<size_t>(split[part]) * row_bytes;
  const size_t group_bytes = static_cast<size_t>(group) * row_bytes;
  char* in_matrix = static_cast<char*>(const_cast<void*>(matrix)) + first * row_bytes;
  const size_t groups = static_cast<size_t>(rows / group);
  if (gather) return Copy2dArgs{part_data, part_bytes, space, in_matrix, group_bytes, space, groups, part_bytes};
  return Copy2dArgs{in_matrix, group_bytes, space, part_data, part_bytes, space, groups, part_bytes};
}

// The memory a job's buffers live in: the backend's for device memory, else host memory.
Memory& MemoryOf(Backend& backend, MemorySpace space, HostMemory& host) {
  return space == MemorySpace::kDevice ? backend.memory() : static_cast<Memory&>(host);
}

absl::Status CheckSpace(Backend& backend, MemorySpace space, const std::string& what) {
  if (space == MemorySpace::kDevice && backend.memory().space() != MemorySpace::kDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": buffers in device memory, but the ", backend.Info().name, " backend has none"));
  }
  return absl::OkStatus();
}

// Rows of part `part` in a matrix of `rows` rows (rows divisible by q+k+v).
int64_t QkvPartRows(int64_t rows, const std::vector<int64_t>& split, int part) {
  return rows / (split[0] + split[1] + split[2]) * split[part];
}

absl::Status CheckJob(const MatrixJob& job) {
  const std::string what = absl::StrCat("matrix \"", BoundedText(job.name), "\"");
  if (job.options == nullptr || job.in == nullptr || job.out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": missing options, input or output buffer"));
  }
  if (job.shape.rows <= 0 || job.shape.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape ", job.shape.rows, "x", job.shape.cols, " must be positive"));
  }
  // A scale_shape left at {0, 0} would silently give an all-zero (or NaN) result.
  if (job.scale_shape.rows <= 0 || job.scale_shape.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": scale_shape ", job.scale_shape.rows, "x",
                                                   job.scale_shape.cols, " must be positive"));
  }
  // The options were validated where the matrix entered the server (ValidateNsOptions, once):
  // what is checked here are the shapes they are applied to.
  RETURN_IF_ERROR(ValidateNsOptionsForShape(*job.options, job.shape, absl::StrCat(what, " options")));
  if (!job.options->split_qkv.empty()) {
    RETURN_IF_ERROR(ValidateNsOptionsForShape(*job.options, job.scale_shape, absl::StrCat(what, " options")));
  }
  if (job.batch_rows < 0 || (job.batch_rows > 0 && job.shape.rows % job.batch_rows != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch of ", job.batch_rows, "-row matrices in ",
                                                   job.shape.rows, " rows"));
  }
  if (job.batch_rows > 0 && (!job.options->split_qkv.empty() || !(job.scale_shape == job.shape))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a batch of matrices takes neither split_qkv nor a scale shape of its own"));
  }
  return absl::OkStatus();
}

}  // namespace

NsKernelArgs ResolveKernelArgs(const NsOptions& options, Matrix2d shape, Matrix2d scale_shape) {
  NsKernelArgs args;
  args.schedule = CoefficientSchedule(options);
  args.precision = options.precision;
  args.eps = options.eps;
  args.eps_mode = options.eps_mode;
  args.normalization = options.normalization;
  args.transpose = ResolveTranspose(options.transpose, shape.rows, shape.cols);
  args.scale = ScaleFactor(scale_shape.rows, scale_shape.cols, options.scale_mode, options.extra_scale);
  return args;
}

std::vector<absl::Status> Orthogonalize(Backend& backend, absl::Span<const MatrixJob> jobs) {
  std::vector<absl::Status> results(jobs.size());

  // Every job becomes one backend task, or three (Q, K, V) under split_qkv. The staging
  // buffers and argument blocks live until the backend returns.
  struct Staged {
    size_t job;
    int part;  // -1: the whole job; 0..2: Q, K, V.
    MemoryBuffer in;
    MemoryBuffer out;
  };
  HostMemory host;
  std::vector<Staged> staged;
  std::vector<NsKernelArgs> args;
  std::vector<NsTask> tasks;
  std::vector<size_t> task_job;
  staged.reserve(jobs.size() * 3);
  args.reserve(jobs.size() * 3);

  for (size_t j = 0; j < jobs.size(); ++j) {
    const MatrixJob& job = jobs[j];
    results[j] = CheckJob(job);
    if (results[j].ok()) {
      results[j] = CheckSpace(backend, job.space, absl::StrCat("matrix \"", BoundedText(job.name), "\""));
    }
    if (!results[j].ok()) continue;
    const NsOptions& o = *job.options;
    if (job.batch_rows > 0) {
      // The matrices of a batch are consecutive row slabs: each is a task on the job's buffers.
      const Matrix2d shape{job.batch_rows, job.shape.cols};
      const size_t in_bytes = static_cast<size_t>(shape.numel()) * ElementSize(job.in_dtype);
      const size_t out_bytes = static_cast<size_t>(shape.numel()) * ElementSize(job.out_dtype);
      for (int64_t b = 0; b < job.shape.rows / job.batch_rows; ++b) {
        args.push_back(ResolveKernelArgs(o, shape, shape));
        tasks.push_back(NsTask{shape, job.in_dtype, static_cast<const char*>(job.in) + b * in_bytes, job.out_dtype,
                               static_cast<char*>(job.out) + b * out_bytes, nullptr, job.space});
        task_job.push_back(j);
        staged.push_back(Staged{j, -1, {}, {}});
      }
      continue;
    }
    if (o.split_qkv.empty()) {
      args.push_back(ResolveKernelArgs(o, job.shape, job.scale_shape));
      tasks.push_back(NsTask{job.shape, job.in_dtype, job.in, job.out_dtype, job.out, nullptr, job.space});
      task_job.push_back(j);
      staged.push_back(Staged{j, -1, {}, {}});
      continue;
    }
    // Q, K and V: each part gathered into a buffer of the job's memory.
    Memory& memory = MemoryOf(backend, job.space, host);
    const std::string what = absl::StrCat("matrix \"", BoundedText(job.name), "\" split_qkv part");
    std::vector<Staged> parts;
    for (int part = 0; part < 3 && results[j].ok(); ++part) {
      Matrix2d shape{QkvPartRows(job.shape.rows, o.split_qkv, part), job.shape.cols};
      absl::StatusOr<MemoryBuffer> in = memory.Allocate(static_cast<size_t>(shape.numel()) * ElementSize(job.in_dtype),
                                                        false, what.c_str());
      absl::StatusOr<MemoryBuffer> out = memory.Allocate(
          static_cast<size_t>(shape.numel()) * ElementSize(job.out_dtype), false, what.c_str());
      if (!in.ok() || !out.ok()) {
        results[j] = in.ok() ? out.status() : in.status();
        break;
      }
      results[j] = memory.Copy2d(QkvPartCopy(job.in, in->data(), job.shape.rows, job.shape.cols,
                                             ElementSize(job.in_dtype), o.split_qkv, part, true, job.space));
      parts.push_back(Staged{j, part, *std::move(in), *std::move(out)});
    }
    if (!results[j].ok()) continue;
    for (Staged& s : parts) {
      Matrix2d shape{QkvPartRows(job.shape.rows, o.split_qkv, s.part), job.shape.cols};
      Matrix2d scale_shape{QkvPartRows(job.scale_shape.rows, o.split_qkv, s.part), job.scale_shape.cols};
      args.push_back(ResolveKernelArgs(o, shape, scale_shape));
      tasks.push_back(NsTask{shape, job.in_dtype, nullptr, job.out_dtype, nullptr, nullptr, job.space});
      task_job.push_back(j);
      staged.push_back(std::move(s));
    }
  }
  // Pointers into `staged` and `args` are taken only now that both have stopped growing.
  for (size_t t = 0; t < tasks.size(); ++t) {
    tasks[t].args = &args[t];
    if (staged[t].part >= 0) {
      tasks[t].in = staged[t].in.data();
      tasks[t].out = staged[t].out.data();
    }
  }

  std::vector<absl::Status> task_results = backend.Run(tasks);
  for (size_t t = 0; t < tasks.size(); ++t) {
    const size_t j = task_job[t];
    if (!task_results[t].ok()) {
      if (results[j].ok()) {
        results[j] = Annotate(task_results[t], absl::StrCat("matrix \"", BoundedText(jobs[j].name), "\""));
      }
      continue;
    }
    if (staged[t].part >= 0) {
      const MatrixJob& job = jobs[j];
      absl::Status scattered = MemoryOf(backend, job.space, host).Copy2d(
          QkvPartCopy(job.out, staged[t].out.data(), job.shape.rows, job.shape.cols, ElementSize(job.out_dtype),
                      job.options->split_qkv, staged[t].part, false, job.space));
      if (!scattered.ok() && results[j].ok()) results[j] = scattered;
    }
  }
  return results;
}

absl::Status OrthogonalizeOne(Backend& backend, const MatrixJob& job) {
  return Orthogonalize(backend, absl::MakeConstSpan(&job, 1))[0];
}

absl::Status OrthogonalizeSharded(Backend& backend, const std::string& name, Matrix2d global, int partition_dim,
                                  const NsOptions& options, absl::Span<const NsShard> shards, SumReducer& reducer) {
  const std::string what = absl::StrCat("matrix \"", BoundedText(name), "\"");
  if (partition_dim != 0 && partition_dim != 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": partition_dim = ", partition_dim, " must be 0 or 1"));
  }
  RETURN_IF_ERROR(ValidateNsOptionsForShape(options, global, absl::StrCat(what, " options")));
  for (const NsShard& s : shards) {
    RETURN_IF_ERROR(ValidateNsOptionsForShape(options, s.shape, absl::StrCat(what, " shard options")));
  }

  // TP_DISTRIBUTED forces the orientation: the sharded dim is the long one.
  NsOptions forced = options;
  forced.transpose = partition_dim == 0 ? TransposeMode::kOn : TransposeMode::kOff;

  if (options.split_qkv.empty()) {
    NsKernelArgs args = ResolveKernelArgs(forced, global, global);
    NsShardedTask task{std::vector<NsShard>(shards.begin(), shards.end()), partition_dim,
                       partition_dim == 0 ? global.cols : global.rows, &args};
    return Annotate(backend.RunSharded(task, reducer), what);
  }

  HostMemory host;
  for (int part = 0; part < 3; ++part) {
    Matrix2d part_global{QkvPartRows(global.rows, options.split_qkv, part), global.cols};
    NsKernelArgs args = ResolveKernelArgs(forced, part_global, part_global);
    std::vector<MemoryBuffer> ins, outs;
    std::vector<NsShard> part_shards;
    const std::string part_what = absl::StrCat(what, " split_qkv part ", part);
    for (const NsShard& s : shards) {
      RETURN_IF_ERROR(CheckSpace(backend, s.space, what));
      Memory& memory = MemoryOf(backend, s.space, host);
      Matrix2d shape{QkvPartRows(s.shape.rows, options.split_qkv, part), s.shape.cols};
      ASSIGN_OR_RETURN(MemoryBuffer in, memory.Allocate(static_cast<size_t>(shape.numel()) * ElementSize(s.in_dtype),
                                                        false, part_what.c_str()));
      ASSIGN_OR_RETURN(MemoryBuffer out, memory.Allocate(static_cast<size_t>(shape.numel()) * ElementSize(s.out_dtype),
                                                         false, part_what.c_str()));
      RETURN_IF_ERROR(memory.Copy2d(QkvPartCopy(s.in, in.data(), s.shape.rows, s.shape.cols, ElementSize(s.in_dtype),
                                                options.split_qkv, part, true, s.space)));
      part_shards.push_back(NsShard{shape, s.in_dtype, in.data(), s.out_dtype, out.data(), s.space});
      ins.push_back(std::move(in));
      outs.push_back(std::move(out));
    }
    NsShardedTask task{part_shards, partition_dim, partition_dim == 0 ? part_global.cols : part_global.rows, &args};
    RETURN_IF_ERROR(Annotate(backend.RunSharded(task, reducer), part_what));
    for (size_t i = 0; i < shards.size(); ++i) {
      RETURN_IF_ERROR(MemoryOf(backend, shards[i].space, host)
                          .Copy2d(QkvPartCopy(shards[i].out, outs[i].data(), shards[i].shape.rows,
                                              shards[i].shape.cols, ElementSize(shards[i].out_dtype),
                                              options.split_qkv, part, false, shards[i].space)));
    }
  }
  return absl::OkStatus();
}

}  // namespace orthoserve
