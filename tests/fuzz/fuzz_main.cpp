// The regression runner of a fuzz target, for builds without libFuzzer (g++): runs
// LLVMFuzzerTestOneInput over every file of the directories (or files) given. A crash, a
// sanitizer report or an abort fails the run; the committed corpora (tests/fuzz/corpus) hold
// the seeds and every input that once found a bug.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++n;
    }
  }
  std::printf("fuzz regression: %zu inputs, no crash\n", n);
  return n > 0 ? 0 : 1;
}
