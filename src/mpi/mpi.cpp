// SPDX-License-Identifier: Apache-2.0
// The MPI Communicator and session (mpi/mpi.hpp).
#include "attnmix/mpi/mpi.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

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

// Both halves move the blocks in rounds of at most kMaxPiece doubles in all: round k carries entries
// [k·m, (k + 1)·m) of every block (m = kMaxPiece / P), by point-to-point messages straight from and into values (MPI
// counts are int; no offset into values is ever one). Every rank runs the same rounds: every rank passes the same
// blocks.
namespace {
struct Rounds {
  std::vector<int64_t> offsets;  // where each block starts in values
  int64_t longest = 0;           // the largest block
  int64_t width = 1;             // m: entries of each block per round
};
Rounds rounds_of(std::span<const int64_t> blocks, size_t values, int ranks) {
  Rounds r;
  int64_t total = 0;
  for (int64_t b : blocks) {
    r.offsets.push_back(total);
    total += b;
    r.longest = std::max(r.longest, b);
  }
  if (blocks.size() != static_cast<size_t>(ranks) || total != static_cast<int64_t>(values))
    throw std::invalid_argument("MpiCommunicator: the blocks must be one per rank and cover the values");
  r.width = std::max<int64_t>(1, static_cast<int64_t>(kMaxPiece) / ranks);
  return r;
}
int in_round(int64_t block, int64_t start, int64_t width) {
  return static_cast<int>(std::clamp<int64_t>(block - start, 0, width));
}
constexpr int kTag = 7;
}  // namespace

void MpiCommunicator::sum(std::span<double> values) const {
  for (size_t begin = 0; begin < values.size(); begin += kMaxPiece) {
    const std::span<double> piece = values.subspan(begin, std::min(kMaxPiece, values.size() - begin));
    const std::vector<int64_t> blocks = even_blocks(static_cast<int64_t>(piece.size()), size_);
    sum_own_block(piece, blocks);
    gather_blocks(piece, blocks);
  }
}

void MpiCommunicator::sum_own_block(std::span<double> values, std::span<const int64_t> blocks) const {
  const Rounds r = rounds_of(blocks, values.size(), size_);
  if (size_ == 1) return;  // the sum over one rank is its own values
  const auto P = static_cast<size_t>(size_);
  const auto me = static_cast<size_t>(rank_);
  double* own = values.data() + r.offsets[me];
  std::vector<double> incoming;
  std::vector<MPI_Request> requests;
  for (int64_t start = 0; start < r.longest; start += r.width) {
    const int mine = in_round(blocks[me], start, r.width);
    incoming.resize(static_cast<size_t>(mine) * P);
    requests.clear();
    for (size_t q = 0; q < P; ++q) {
      if (q == me) continue;
      if (mine > 0) {
        requests.emplace_back();
        check(MPI_Irecv(incoming.data() + q * static_cast<size_t>(mine), mine, MPI_DOUBLE, static_cast<int>(q), kTag,
                        comm_, &requests.back()),
              "MPI_Irecv");
      }
      if (const int theirs = in_round(blocks[q], start, r.width); theirs > 0) {
        requests.emplace_back();
        check(MPI_Isend(values.data() + r.offsets[q] + start, theirs, MPI_DOUBLE, static_cast<int>(q), kTag, comm_,
                        &requests.back()),
              "MPI_Isend");
      }
    }
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    // In rank order, ((v₀ + v₁) + v₂) + …, written over this rank's own part as it goes: ranks 0 and 1 read their
    // part in the first pass, before it is overwritten; a later rank's part is set aside first.
    const auto part = [&](size_t q) { return incoming.data() + q * static_cast<size_t>(mine); };
    double* out = own + start;
    if (me >= 2) std::copy_n(out, mine, part(me));
    const double* v0 = me == 0 ? out : part(0);
    const double* v1 = me == 1 ? out : part(1);
    for (int i = 0; i < mine; ++i) out[i] = v0[i] + v1[i];
    for (size_t q = 2; q < P; ++q) {
      const double* vq = part(q);
      for (int i = 0; i < mine; ++i) out[i] += vq[i];
    }
  }
}

void MpiCommunicator::gather_blocks(std::span<double> values, std::span<const int64_t> blocks) const {
  const Rounds r = rounds_of(blocks, values.size(), size_);
  if (size_ == 1) return;  // the only block is this rank's
  const auto P = static_cast<size_t>(size_);
  const auto me = static_cast<size_t>(rank_);
  std::vector<MPI_Request> requests;
  for (int64_t start = 0; start < r.longest; start += r.width) {
    requests.clear();
    const int mine = in_round(blocks[me], start, r.width);
    for (size_t q = 0; q < P; ++q) {
      if (q == me) continue;
      if (const int theirs = in_round(blocks[q], start, r.width); theirs > 0) {
        requests.emplace_back();
        check(MPI_Irecv(values.data() + r.offsets[q] + start, theirs, MPI_DOUBLE, static_cast<int>(q), kTag, comm_,
                        &requests.back()),
              "MPI_Irecv");
      }
      if (mine > 0) {
        requests.emplace_back();
        check(MPI_Isend(values.data() + r.offsets[me] + start, mine, MPI_DOUBLE, static_cast<int>(q), kTag, comm_,
                        &requests.back()),
              "MPI_Isend");
      }
    }
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
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
