// SPDX-License-Identifier: Apache-2.0
// A minimal fuzzing engine for the targets that cannot link libFuzzer (docs/fuzzing.md): fuzz_checkpoint needs
// libtorch, whose Debian headers (1.13) do not compile with clang in C++20, so it is built with GCC and
// -fsanitize=address,undefined and this main(). It accepts the libFuzzer flags fuzz/run.sh passes:
//   prog [-flag=value ...] FILE_OR_DIR...
//   files only, no -max_total_time/-runs: each file is run once (reproduce a finding);
//   otherwise every input is run once, then random mutations of them (bit flips, interesting bytes and numbers,
//   dictionary tokens, insertions, erasures, duplications, crossovers, truncations) until -max_total_time seconds
//   or -runs inputs. There is no coverage feedback: mutants are not added to the corpus. Deterministic for a -seed.
// Used flags: -max_total_time, -runs, -seed, -timeout (per input, SIGALRM), -artifact_prefix, -dict. Others
// (-rss_limit_mb, -print_final_stats, -fork, -ignore_*) are accepted and ignored; the allocation limit is
// ASan's max_allocation_size_mb (2048, __asan_default_options below). A finding writes its input to
// <artifact_prefix>crash-<hash> (or timeout-<hash>) and ends the process with a non-zero status.
#include <sanitizer/common_interface_defs.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

extern "C" const char* __asan_default_options() {
  return "max_allocation_size_mb=2048:allocator_may_return_null=0:detect_leaks=1";
}

namespace {

std::string g_artifact_prefix = "./";
// The input being run, written out on a finding. Never destroyed: LeakSanitizer's exit-time check may call the
// death callback after static destructors have run. g_running: a finding outside an input (the exit-time leak
// check) writes no artifact, since no single input can be named.
std::vector<uint8_t>& g_current = *new std::vector<uint8_t>;
bool g_running = false;

uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

// Async-signal-safe enough for a dying process: open/write/close only.
void write_artifact(const char* kind) {
  char name[4096];
  std::snprintf(name, sizeof name, "%s%s-%016llx", g_artifact_prefix.c_str(), kind,
                static_cast<unsigned long long>(fnv1a(g_current)));
  FILE* f = std::fopen(name, "wb");
  if (f) {
    std::fwrite(g_current.data(), 1, g_current.size(), f);
    std::fclose(f);
  }
  std::fprintf(stderr, "==standalone== %s: input written to %s (%zu bytes)\n", kind, name, g_current.size());
}

void on_death() {
  if (g_running) write_artifact("crash");
}

void on_signal(int sig) {
  if (sig == SIGALRM) {
    write_artifact("timeout");
    std::fprintf(stderr, "==standalone== ERROR: timeout: one input ran longer than -timeout\n");
    _exit(70);
  }
  alarm(0);
  write_artifact("crash");
  signal(sig, SIG_DFL);
  raise(sig);
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// libFuzzer dictionary lines: name="token" or "token", with \\, \" and \xNN escapes.
std::vector<std::vector<uint8_t>> read_dict(const std::string& path) {
  std::vector<std::vector<uint8_t>> tokens;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t open = line.find('"');
    const size_t close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    std::vector<uint8_t> t;
    for (size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        if (line[i + 1] == 'x' && i + 3 < close) {
          t.push_back(static_cast<uint8_t>(std::stoi(line.substr(i + 2, 2), nullptr, 16)));
          i += 3;
        } else {
          t.push_back(static_cast<uint8_t>(line[++i]));
        }
      } else {
        t.push_back(static_cast<uint8_t>(line[i]));
      }
    }
    tokens.push_back(std::move(t));
  }
  return tokens;
}

const char* const kNumbers[] = {"0", "-1", "1e999", "-0", "4294967296", "9223372036854775807",
                                "9223372036854775808", "18446744073709551615", "99999999999999999999",
                                "2305843009213693953", "1e-320", "nan", "NaN", "Infinity"};

void mutate(std::vector<uint8_t>& x, Rng& rng, const std::vector<std::vector<uint8_t>>& corpus,
            const std::vector<std::vector<uint8_t>>& dict) {
  const int n = 1 + static_cast<int>(rng.below(4));
  for (int k = 0; k < n; ++k) {
    const size_t pos = rng.below(x.size() + 1);
    switch (rng.below(10)) {
      case 0:
        if (!x.empty()) x[rng.below(x.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
        break;
      case 1:
        if (!x.empty()) x[rng.below(x.size())] = static_cast<uint8_t>(rng.next());
        break;
      case 2: {
        static const uint8_t kBytes[] = {0, 1, 0x7f, 0x80, 0xff, '"', '{', '[', ',', '\n'};
        if (!x.empty()) x[rng.below(x.size())] = kBytes[rng.below(sizeof kBytes)];
        break;
      }
      case 3: {  // a number written over the bytes at pos
        const char* s = kNumbers[rng.below(std::size(kNumbers))];
        for (size_t i = 0; s[i] && pos + i < x.size(); ++i) x[pos + i] = static_cast<uint8_t>(s[i]);
        break;
      }
      case 4:
        if (!dict.empty()) {
          const auto& t = dict[rng.below(dict.size())];
          x.insert(x.begin() + static_cast<std::ptrdiff_t>(pos), t.begin(), t.end());
        }
        break;
      case 5: {  // erase a range
        const size_t len = rng.below(std::min<size_t>(x.size() - std::min(pos, x.size()), 64) + 1);
        x.erase(x.begin() + static_cast<std::ptrdiff_t>(pos), x.begin() + static_cast<std::ptrdiff_t>(pos + len));
        break;
      }
      case 6: {  // duplicate a range
        if (x.empty()) break;
        const size_t from = rng.below(x.size());
        const size_t len = 1 + rng.below(std::min<size_t>(x.size() - from, 64));
        const std::vector<uint8_t> chunk(x.begin() + static_cast<std::ptrdiff_t>(from),
                                         x.begin() + static_cast<std::ptrdiff_t>(from + len));
        x.insert(x.begin() + static_cast<std::ptrdiff_t>(pos), chunk.begin(), chunk.end());
        break;
      }
      case 7: {  // crossover: a piece of another input
        const auto& other = corpus[rng.below(corpus.size())];
        if (other.empty()) break;
        const size_t from = rng.below(other.size());
        const size_t len = 1 + rng.below(std::min<size_t>(other.size() - from, 256));
        x.insert(x.begin() + static_cast<std::ptrdiff_t>(pos), other.begin() + static_cast<std::ptrdiff_t>(from),
                 other.begin() + static_cast<std::ptrdiff_t>(from + len));
        break;
      }
      case 8:
        x.resize(pos);
        break;
      default: {  // a little-endian 8-byte extreme over the bytes at pos
        static const uint64_t kWords[] = {0, ~0ull, 0x7fffffffffffffffull, 0x8000000000000000ull, 0xffffffffull,
                                          1ull << 61, 1ull << 62};
        const uint64_t w = kWords[rng.below(std::size(kWords))];
        for (size_t i = 0; i < 8 && pos + i < x.size(); ++i) x[pos + i] = static_cast<uint8_t>(w >> (8 * i));
        break;
      }
    }
  }
}

void run_one(const std::vector<uint8_t>& input, unsigned timeout) {
  g_current = input;
  g_running = true;
  if (timeout) alarm(timeout);
  LLVMFuzzerTestOneInput(g_current.data(), g_current.size());
  if (timeout) alarm(0);
  g_running = false;
}

}  // namespace

int main(int argc, char** argv) {
  double max_total_time = -1;
  long long runs = -1;
  uint64_t seed = 1;
  unsigned timeout = 0;
  std::string dict_path;
  std::vector<std::filesystem::path> files, dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? a.c_str() + n : nullptr;
    };
    const char* v = nullptr;
    if ((v = value("-max_total_time="))) max_total_time = std::atof(v);
    else if ((v = value("-runs="))) runs = std::atoll(v);
    else if ((v = value("-seed="))) seed = std::strtoull(v, nullptr, 10);
    else if ((v = value("-timeout="))) timeout = static_cast<unsigned>(std::atoi(v));
    else if ((v = value("-artifact_prefix="))) g_artifact_prefix = v;
    else if ((v = value("-dict="))) dict_path = v;
    else if (a[0] == '-') continue;  // other libFuzzer flags
    else if (std::filesystem::is_directory(a)) dirs.emplace_back(a);
    else files.emplace_back(a);
  }
  __sanitizer_set_death_callback(on_death);
  for (int sig : {SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL, SIGALRM}) signal(sig, on_signal);
  std::set_terminate([] {
    alarm(0);  // the report below (a symbolised stack) may outlast the input's timeout: one finding, not two
    write_artifact("crash");
    std::fprintf(stderr, "==standalone== ERROR: an exception escaped the target\n");
    if (auto e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::fprintf(stderr, "==standalone== what(): %s\n", x.what());
      } catch (...) {
      }
    }
    __sanitizer_print_stack_trace();
    _exit(71);
  });

  const auto start = std::chrono::steady_clock::now();
  long long executed = 0;
  if (dirs.empty() && max_total_time < 0 && runs < 0) {  // reproduce: each file once
    for (const auto& f : files) {
      std::fprintf(stderr, "Running: %s\n", f.c_str());
      run_one(read_file(f), timeout);
      ++executed;
    }
    std::fprintf(stderr, "Done %lld runs\n", executed);
    return 0;
  }
  std::vector<std::vector<uint8_t>> corpus;
  for (const auto& f : files) corpus.push_back(read_file(f));
  for (const auto& d : dirs)
    for (const auto& e : std::filesystem::recursive_directory_iterator(d))
      if (e.is_regular_file()) corpus.push_back(read_file(e.path()));
  if (corpus.empty()) corpus.emplace_back();
  const auto dict = dict_path.empty() ? std::vector<std::vector<uint8_t>>{} : read_dict(dict_path);
  for (const auto& input : corpus) {
    run_one(input, timeout);
    ++executed;
  }
  Rng rng{seed};
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while ((runs < 0 || executed < runs) && (max_total_time < 0 || elapsed() < max_total_time)) {
    std::vector<uint8_t> x = corpus[rng.below(corpus.size())];
    mutate(x, rng, corpus, dict);
    if (x.size() > (1u << 20)) x.resize(1u << 20);
    run_one(x, timeout);
    ++executed;
  }
  std::fprintf(stderr, "Done %lld runs in %.0f second(s)\n", executed, elapsed());
  return 0;
}
