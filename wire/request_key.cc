// Deterministic serialization, and RequestKey over it: the messages' bytes are hashed by
// RequestKeyOfSerialized, the one implementation every client shares (the Python client calls
// it through the client core with its own serializations).
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "wire/serialized_request_key.h"
#include "wire/wire.h"

namespace kiln::wire {

std::string DeterministicBytes(const google::protobuf::MessageLite& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return bytes;
}

std::string RequestKey(const v1::Graph& graph, const v1::Target& target,
                       const v1::CompileOptions& options) {
  return RequestKeyOfSerialized(DeterministicBytes(graph), DeterministicBytes(target),
                                DeterministicBytes(options));
}

}  // namespace kiln::wire
