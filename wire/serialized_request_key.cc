#include "wire/serialized_request_key.h"

#include <cstdint>

#include "kernels/key/sha256.h"

namespace kiln::wire {

std::string RequestKeyOfSerialized(std::string_view graph, std::string_view target,
                                   std::string_view options) {
  std::string bytes = "kiln-request-key-v1\n";
  bytes.reserve(bytes.size() + 24 + graph.size() + target.size() + options.size());
  for (std::string_view message : {graph, target, options}) {
    const uint64_t n = message.size();
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    bytes.append(message);
  }
  return key::Sha256Hex(bytes);
}

}  // namespace kiln::wire
