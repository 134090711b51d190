#include "tools/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace dsv4 {

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict += " ";
    n *= shape[i];
  }
  dict += "), }";
  // Magic (6) + version (2) + length (2) + dict + padding + '\n' is a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error(path + ": cannot write");
    f.write("\x93NUMPY\x01\x00", 8);
    uint16_t len = static_cast<uint16_t>(dict.size());
    char l[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
    f.write(l, 2);
    f.write(dict.data(), static_cast<std::streamsize>(dict.size()));
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) throw Error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(path + ": cannot rename temporary file");
}

NpyF32 read_npy_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open");
  char head[10];
  if (!f.read(head, 10) || std::memcmp(head, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file");
  size_t hlen;
  if (head[6] == 1) {
    hlen = static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8);
  } else {
    char more[2];
    if (!f.read(more, 2)) throw Error(path + ": truncated header");
    hlen = static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8) |
           (static_cast<uint8_t>(more[0]) << 16) | (static_cast<size_t>(static_cast<uint8_t>(more[1])) << 24);
  }
  std::string dict(hlen, '\0');
  if (!f.read(dict.data(), static_cast<std::streamsize>(hlen))) throw Error(path + ": truncated header");
  if (dict.find("'<f4'") == std::string::npos) throw Error(path + ": dtype is not '<f4'");
  if (dict.find("'fortran_order': True") != std::string::npos) throw Error(path + ": fortran order not supported");
  std::smatch m;
  if (!std::regex_search(dict, m, std::regex("'shape': \\(([0-9, ]*)\\)"))) throw Error(path + ": no shape");
  NpyF32 out;
  std::string s = m[1];
  int64_t n = 1;
  const std::regex num("[0-9]+");
  for (std::sregex_iterator it(s.begin(), s.end(), num), end; it != end; ++it) {
    out.shape.push_back(std::stoll(it->str()));
    n *= out.shape.back();
  }
  out.data.resize(static_cast<size_t>(n));
  if (!f.read(reinterpret_cast<char*>(out.data.data()), static_cast<std::streamsize>(n * sizeof(float))))
    throw Error(path + ": truncated data");
  return out;
}

}  // namespace dsv4
