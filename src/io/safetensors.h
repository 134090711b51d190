#pragma once
// safetensors reading (mmap, strict validation) and writing (single file or sharded with
// model.safetensors.index.json). Every error names the file and, where there is one, the tensor.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsv4 {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2, F8_E8M0 };

const char* dtype_name(DType t);        // the safetensors spelling, e.g. "F8_E4M3"
size_t dtype_size(DType t);             // bytes per element
bool dtype_from_name(const std::string& s, DType* out);

struct TensorInfo;
class ReadProgress;  // io/bulk_read.h
// The bytes [first, second) of a tensor a process needs ({0, 0}: none; {0, nbytes}: all).
using ByteRange = std::function<std::pair<size_t, size_t>(const TensorInfo&)>;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping; valid while the owning file lives
  size_t nbytes = 0;
  std::string file;               // path of the file that holds it

  int64_t numel() const;
  std::string shape_str() const;  // "[3, 4]"
};

// One mmap'd .safetensors file. Validates on open:
//  - file at least 8 bytes, header length <= file size - 8 and <= 100 MB,
//  - header is a JSON object; each entry has dtype (known), shape (non-negative ints),
//    data_offsets [begin, end] with begin <= end,
//  - end - begin == numel * dtype_size, end <= data section size,
//  - no two tensors overlap. "__metadata__" is allowed (string map) and kept.
// How a file's bytes get into memory. Both keep the tensors exactly as stored.
//  Mmap: a read-only file mapping (instant start, pages shared with the page cache; 4 KiB pages).
//  Read: read into anonymous memory advised for transparent huge pages, then made read-only;
//        each tensor 64-byte aligned, from 1 MiB on 4 KiB aligned (SafeTensorsFile::read_ranges).
//        Costs a copy at load (and the bytes count in RSS), but streams faster: on the
//        development VM the BF16 head GEMV reads at 84-92% of the measured bandwidth from such
//        memory vs 66-73% from the file mapping (docs/perf.md).
//  Auto: Read when all shards together take at most half of MemAvailable, else Mmap.
enum class LoadMode { Auto, Mmap, Read };
const char* load_mode_name(LoadMode m);
LoadMode parse_load_mode(const std::string& s);  // "auto" | "mmap" | "read"; throws dsv4::Error

class SafeTensorsFile {
 public:
  // Read mode reports the bytes read to `progress` (may be null).
  static std::unique_ptr<SafeTensorsFile> open(const std::string& path, LoadMode mode = LoadMode::Mmap,
                                               ReadProgress* progress = nullptr);  // throws dsv4::Error
  ~SafeTensorsFile();
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return size_; }
  // For a mapped file: reads the byte range `range` gives of each tensor into anonymous memory
  // (huge pages advised) and points the tensor there. A tensor read in part keeps its whole
  // size of address space, but only the pages read become resident; tensors not read stay
  // mapped and, never touched, take no memory either. A process that holds only part of the
  // model (docs/parallel.md: some experts, some rows of a matrix) reads only that part.
  void read_ranges(const ByteRange& range, ReadProgress* progress = nullptr);
  size_t bytes_of(const ByteRange& range) const;

 private:
  SafeTensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  void* copy_ = nullptr;  // read_ranges' memory
  size_t copy_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: either model.safetensors.index.json (weight_map
// name -> shard file; every listed shard must exist and every mapped tensor must be in its
// shard) or, without an index, every *.safetensors file in the directory. A tensor name
// appearing in two files is an error.
class TensorStore {
 public:
  // Auto is resolved here (load_mode() tells the outcome). Reading more than 1 GiB prints one
  // progress line to stderr.
  static TensorStore open_dir(const std::string& dir, LoadMode mode = LoadMode::Mmap);  // throws dsv4::Error
  // After open_dir(dir, Mmap): only the bytes `range` gives are needed (the others are never
  // read). Resolves `mode` on those bytes (Auto: Read when they take at most half of the
  // available memory) and, for Read, reads them into memory (SafeTensorsFile::read_ranges).
  void hold(LoadMode mode, const ByteRange& range);
  TensorStore() = default;
  TensorStore(TensorStore&&) = default;
  TensorStore& operator=(TensorStore&&) = default;

  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const TensorInfo& get(const std::string& name) const;   // throws "missing tensor NAME in DIR"
  bool has(const std::string& name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;                 // sorted
  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<SafeTensorsFile>>& files() const { return files_; }
  LoadMode load_mode() const { return mode_; }

 private:
  std::string dir_;
  LoadMode mode_ = LoadMode::Mmap;
  std::vector<std::unique_ptr<SafeTensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

// Collects tensors in memory and writes them as one file or as N shards + index.
class SafeTensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  // Writes DIR/model.safetensors (shards == 1) or DIR/model-0000i-of-0000N.safetensors plus
  // DIR/model.safetensors.index.json (shards > 1). Tensors are assigned to shards in order of
  // addition, balancing bytes. Header keys sorted; data 8-byte aligned per file.
  void write(const std::string& dir, int shards = 1) const;
  size_t count() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
};

}  // namespace dsv4
