// Fuzz target: the chat encoding both ways. The input is tried as a messages JSON (a list, or a
// request body with "messages" and "tools") rendered in both modes, and as a completion parsed
// back in both modes (reasoning, content, DSML tool calls). Only dsv4::Error may come out: a
// server turns it into a 400; anything else (a JSON type error from a field of the wrong type)
// would be a 500 or worse.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  for (dsv4::ChatMode mode : {dsv4::ChatMode::Thinking, dsv4::ChatMode::Chat}) {
    try {
      (void)dsv4::parse_completion(s, mode);
    } catch (const dsv4::Error&) {
    }
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    dsv4::ChatOptions o;
    o.mode = mode;
    try {
      (void)dsv4::render_chat(j, o);
    } catch (const dsv4::Error&) {
    }
  }
  return 0;
}
