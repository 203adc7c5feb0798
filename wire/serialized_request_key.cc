#include "wire/serialized_request_key.h"

#include "kernels/key/byte_writer.h"
#include "kernels/key/sha256.h"

namespace kiln::wire {

std::string RequestKeyOfSerialized(std::string_view graph, std::string_view target,
                                   std::string_view options) {
  key::ByteWriter w;
  w.Reserve(20 + 24 + graph.size() + target.size() + options.size());
  w.Raw("kiln-request-key-v1\n");
  for (std::string_view message : {graph, target, options}) w.Str(message);
  return key::Sha256Hex(w.Take());
}

}  // namespace kiln::wire
