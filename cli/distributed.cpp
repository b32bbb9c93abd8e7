// SPDX-License-Identifier: Apache-2.0
// Failure agreement and sharded input for `attnmix fit` under mpirun (distributed.hpp).
#include "distributed.hpp"

#include <algorithm>

namespace attnmix::cli {

namespace {
constexpr const char* kRankPlaceholder = "{rank}";
}  // namespace

FailureReport report_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const AgreedError& e) {
    return {e.exit_code(), e.what()};
  } catch (const UsageError& e) {
    return {kExitUsage, e.what()};
  } catch (const std::bad_alloc&) {
    return {kExitData, "out of memory (are the dimensions what you meant?)"};
  } catch (const std::exception& e) {
    return {kExitData, e.what()};
  } catch (...) {
    return {kExitData, "unknown error"};
  }
}

void agree_on_failure(const Communicator& comm, const std::exception_ptr& own) {
  FailureReport report;
  if (own) {
    report = report_of(own);
    if (report.message.empty()) report.message = "error";
  }
  // Two collectives: every rank's exit code (0: it succeeded), then the lowest failing rank's
  // message. A rank fails exactly when its message is non-empty, so both pick the same rank.
  const std::vector<int64_t> codes = comm.all_counts(own ? report.exit_code : kExitOk);
  const std::string first = comm.first_failure(own ? report.message : std::string());
  if (first.empty()) return;
  const auto failing =
      std::find_if(codes.begin(), codes.end(), [](int64_t c) { return c != kExitOk; });
  const int rank = static_cast<int>(failing - codes.begin());
  const std::string prefix = "rank " + std::to_string(rank) + ": ";  // first_failure's prefix
  const std::string message = first.rfind(prefix, 0) == 0 ? first.substr(prefix.size()) : first;
  throw AgreedError(static_cast<int>(*failing), rank, comm.size(), message);
}

bool has_rank_placeholder(const std::string& path) {
  return path.find(kRankPlaceholder) != std::string::npos;
}

std::string rank_path(const std::string& pattern, int rank) {
  const std::string placeholder = kRankPlaceholder;
  const std::string value = std::to_string(rank);
  std::string path = pattern;
  for (size_t at = path.find(placeholder); at != std::string::npos;
       at = path.find(placeholder, at + value.size()))
    path.replace(at, placeholder.size(), value);
  return path;
}

ShardFile shard_file(const std::string& pattern, const Communicator& comm) {
  ShardFile file;
  file.pattern = pattern;
  file.per_rank = has_rank_placeholder(pattern);
  if (file.per_rank) {
    file.path = rank_path(pattern, comm.rank());
    file.stripe = RowStripe{0, 1, true};
  } else {
    file.path = pattern;
    file.stripe = RowStripe{comm.rank(), comm.size(), true};
  }
  return file;
}

}  // namespace attnmix::cli
