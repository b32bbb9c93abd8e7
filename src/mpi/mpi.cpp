// SPDX-License-Identifier: Apache-2.0
// The MPI Communicator and session (mpi/mpi.hpp).
#include "attnmix/mpi/mpi.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace attnmix {

namespace {
void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string("MPI: ") + what + " failed: " + std::string(text, static_cast<size_t>(length)));
}
// Pieces of 2^20 doubles (8 MiB): MPI counts are int, and Open MPI allocates a temporary of the message size on
// every call, which on this VM costs a page fault per 4 KiB (205 MB in one call: 639 ms; in 8 MiB pieces: 38 ms,
// docs/SCALING.md).
constexpr size_t kMaxPiece = size_t{1} << 20;
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

void MpiCommunicator::sum(std::span<double> values) const {
  for (size_t begin = 0; begin < values.size(); begin += kMaxPiece) {
    const size_t count = std::min(kMaxPiece, values.size() - begin);
    check(MPI_Allreduce(MPI_IN_PLACE, values.data() + begin, static_cast<int>(count), MPI_DOUBLE, MPI_SUM, comm_),
          "MPI_Allreduce");
  }
}

std::vector<int64_t> MpiCommunicator::all_counts(int64_t own) const {
  std::vector<int64_t> counts(static_cast<size_t>(size_));
  check(MPI_Allgather(&own, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, comm_), "MPI_Allgather");
  return counts;
}

std::vector<int64_t> MpiCommunicator::all_values(std::span<const int64_t> own) const {
  const std::vector<int64_t> counts = all_counts(static_cast<int64_t>(own.size()));
  std::vector<int> sizes(counts.size()), offsets(counts.size());
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (total + counts[r] > std::numeric_limits<int>::max())
      throw std::runtime_error("MPI: all_values of more than 2^31 values");
    offsets[r] = static_cast<int>(total);
    sizes[r] = static_cast<int>(counts[r]);
    total += counts[r];
  }
  std::vector<int64_t> out(static_cast<size_t>(total));
  check(MPI_Allgatherv(own.data(), static_cast<int>(own.size()), MPI_INT64_T, out.data(), sizes.data(),
                       offsets.data(), MPI_INT64_T, comm_),
        "MPI_Allgatherv");
  return out;
}

std::string MpiCommunicator::first_failure(const std::string& own) const {
  const std::vector<int64_t> lengths = all_counts(static_cast<int64_t>(own.size()));
  const auto first = std::find_if(lengths.begin(), lengths.end(), [](int64_t n) { return n > 0; });
  if (first == lengths.end()) return {};
  const int root = static_cast<int>(first - lengths.begin());
  std::string message = rank_ == root ? own : std::string(static_cast<size_t>(*first), '\0');
  check(MPI_Bcast(message.data(), static_cast<int>(message.size()), MPI_CHAR, root, comm_), "MPI_Bcast");
  return "rank " + std::to_string(root) + ": " + message;
}

MpiSession::MpiSession(int& argc, char**& argv) {
  int provided = 0;
  check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() { MPI_Finalize(); }

}  // namespace attnmix
