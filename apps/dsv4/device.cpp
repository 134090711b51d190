#include "device.h"

#include <string>

namespace dsv4::cli {

Device device_option(const Args& a) {
  const std::string v = a.str("device", "cpu");
  if (v != "cpu" && v != "cuda") throw Usage("--device must be cpu or cuda, got '" + v + "'");
  const Device d = parse_device(v);
  std::string why;
  if (!device_usable(d, &why)) throw Error("--device cuda: " + why);  // says why none is usable
  return d;
}

}  // namespace dsv4::cli
