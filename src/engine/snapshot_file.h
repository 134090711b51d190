#pragma once
// The framing of snapshot files (Engine::save_snapshot / load_snapshot):
//   "DSV4SNAP", u32 format version, u32 0, u64 fingerprint, i64 token count, the tokens (i32),
//   the snapshot's own bytes (engine.cpp: its host extras, then kv/state_io's state),
//   u64 checksum of everything before it.
// Numbers in this machine's byte order: the fingerprint binds a file to the model, the build
// and the kernels' ISA, whose results it holds (another's is not read, never misread).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsv4 {

struct ModelWeights;

// What a snapshot's results depend on: the checkpoint (config.json, every tensor's name, dtype,
// shape and bytes sampled at its start, middle and end), this executable, and the ISA.
uint64_t snapshot_fingerprint(const ModelWeights& w, const std::string& model_dir, const std::string& isa);

// What a snapshot file holds, gathered on the engine's thread (Engine::snapshot_image). Framing
// and writing it touch nothing else, so any thread may do them (the server's writer thread).
struct SnapshotImage {
  uint64_t fingerprint = 0;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> body;  // the snapshot's own bytes
  size_t file_bytes() const;  // the size of its file
};

// The whole file's bytes for an image.
std::vector<uint8_t> frame_snapshot(const SnapshotImage& im);
// Frames the image and writes it with write_file_atomically.
void write_snapshot_file(const SnapshotImage& im, const std::string& path);

constexpr uint32_t kSnapshotFormat = 1;

struct SnapshotFile {
  uint32_t version = 0;  // the format (read_snapshot_file refuses another unless header_only)
  uint64_t fingerprint = 0;
  std::vector<int32_t> tokens;
  size_t body_at = 0;  // where the body starts in `bytes`
  std::vector<uint8_t> bytes;
};
// Reads `path` whole (header_only: its header and tokens) and checks the frame (the checksum
// and the format too when whole). Throws dsv4::Error naming the file and what is wrong.
SnapshotFile read_snapshot_file(const std::string& path, bool header_only);

// The 64-bit hash the frame's checksum uses (also names the server's snapshot files).
uint64_t hash_bytes(const void* p, size_t n);

// Writes `bytes` to path + ".tmp" and renames it over `path`: a reader never sees half a file.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace dsv4
