// Fuzz target: the checkpoint loader's whole validation path. The input holds up to three files
// separated by "\n--8<--\n": config.json, a .safetensors file and, optionally,
// model.safetensors.index.json (then the weights are written as the shard it may name). They go
// to a directory in /dev/shm (memory) and load_model binds them: any outcome but a dsv4::Error
// or success (a crash, a sanitizer report, another exception) is a bug.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"
#include "model/weights.h"

namespace {

void write(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/dev/shm/dsv4-fuzz-checkpoint-" + std::to_string(::getpid());
  static const bool made = std::filesystem::create_directories(dir) || true;
  (void)made;
  for (const auto& e : std::filesystem::directory_iterator(dir)) std::filesystem::remove(e.path());
  const std::string_view in(reinterpret_cast<const char*>(data), size), sep = "\n--8<--\n";
  const size_t a = in.find(sep);
  const size_t b = a == std::string_view::npos ? a : in.find(sep, a + sep.size());
  write(dir + "/config.json", in.substr(0, a));
  if (a != std::string_view::npos) {
    const std::string_view weights = in.substr(a + sep.size(), b == std::string_view::npos ? b : b - a - sep.size());
    if (b != std::string_view::npos) {
      write(dir + "/model.safetensors.index.json", in.substr(b + sep.size()));
      write(dir + "/model-00001-of-00001.safetensors", weights);
    } else {
      write(dir + "/model.safetensors", weights);
    }
  }
  for (dsv4::LoadMode mode : {dsv4::LoadMode::Mmap, dsv4::LoadMode::Read}) {
    try {
      dsv4::ModelWeights w = dsv4::load_model(dir, mode);
      (void)w.format_summary();
    } catch (const dsv4::Error&) {
    }
  }
  return 0;
}
